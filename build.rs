fn main() {
    let _ = protoc_bin_vendored::protoc_bin_path();
    let _ = prost_build::Config::new();
    let _ = tonic_prost_build::configure();
}
