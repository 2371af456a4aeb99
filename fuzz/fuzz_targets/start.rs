//! Arbitrary bytes as a start request: see `respcoord_fuzz::start`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::start(data));
