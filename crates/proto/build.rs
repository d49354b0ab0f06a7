//! Generates the messages, client and server of `proto/*.proto` with protox (a protobuf compiler
//! in Rust, so building needs no `protoc`) and tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/common.proto", "proto/sglang_scheduler.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
