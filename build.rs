//! Generates the Nebius gRPC client from the vendor's own protos in `proto/` (see
//! `proto/README.md`): protox compiles them in Rust (no `protoc` or `buf` binary), and
//! tonic-build turns the descriptors into prost messages and tonic clients. The server
//! stubs are generated only with the `test-doubles` feature, for the tests' local Nebius.

use std::path::Path;

/// The services gpuprov calls (and `ServiceError`, the error details), relative to `proto/`.
const ROOTS: &[&str] = &[
    "nebius/compute/v1/instance_service.proto",
    "nebius/compute/v1/platform_service.proto",
    "nebius/compute/v1/image_service.proto",
    "nebius/common/v1/operation_service.proto",
    "nebius/common/v1/error.proto",
    "nebius/vpc/v1/subnet_service.proto",
    "nebius/vpc/v1/security_group_service.proto",
    "nebius/vpc/v1/security_rule_service.proto",
    "nebius/iam/v1/token_exchange_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    // The binary's relative relocations packed (DT_RELR: glibc 2.36, GNU ld 2.38): on every
    // start the loader then reads a few kB instead of a 1.9 MB table (issue 20,
    // BENCHMARKS.md). An older ld ignores the option with a warning.
    let target_is = |key: &str, value: &str| std::env::var(key).as_deref() == Ok(value);
    if target_is("CARGO_CFG_TARGET_OS", "linux") && target_is("CARGO_CFG_TARGET_ENV", "gnu") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let root = Path::new("proto");
    let files: Vec<_> = ROOTS.iter().map(|f| root.join(f)).collect();
    let mut fds = protox::compile(&files, [root, &root.join("third_party")])?;
    // Only options refer to buf.validate: it needs no Rust code of its own (prost maps
    // google.protobuf to prost-types by itself).
    fds.file.retain(|f| !f.name().starts_with("buf/"));
    let tests = std::env::var_os("CARGO_FEATURE_TEST_DOUBLES").is_some();
    tonic_build::configure()
        .build_client(true)
        .build_server(tests)
        .build_transport(false)
        // The test server implements only the calls gpuprov makes; the rest answer UNIMPLEMENTED.
        .generate_default_stubs(true)
        .include_file("nebius_protos.rs")
        .compile_fds(fds)?;
    Ok(())
}
