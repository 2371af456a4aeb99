//! Compiles `respcoord/v1/coordinator.proto` with protox (pure Rust), so
//! building needs no system `protoc`. Only the stubs the enabled features ask
//! for are generated: a client build has no server code, and the reverse.
//! The encoded descriptor set is written out for gRPC server reflection.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "respcoord/v1/coordinator.proto";
    println!("cargo:rerun-if-changed={proto}");
    let client = env::var_os("CARGO_FEATURE_CLIENT").is_some();
    let server = env::var_os("CARGO_FEATURE_SERVER").is_some();

    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_source_info(true).open_file(proto)?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("respcoord_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(client)
        .build_server(server)
        // Buffers sized for watches held open for a whole call.
        .codec_path("crate::codec::Codec")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
