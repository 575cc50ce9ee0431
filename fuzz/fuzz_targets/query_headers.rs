#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| eureka_operator_fuzz::entries::query_headers(data));
