#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| medea::fuzz::sim_http(data));
