//! The VM launch and teardown machines (design 4.3, 4.4).
