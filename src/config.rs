//! User configuration (`gpuprov.toml`).
