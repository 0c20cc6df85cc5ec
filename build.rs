//! Compiles the CSI protocol (`src/csi/csi.proto`) and the kubelet's
//! plugin-registration API (`src/csi/pluginregistration.proto`) with protox,
//! a protobuf compiler in Rust: building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["src/csi/csi.proto", "src/csi/pluginregistration.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["src/csi"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
