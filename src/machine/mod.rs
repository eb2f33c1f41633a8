//! The executor (design 4.2).
