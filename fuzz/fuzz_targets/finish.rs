//! Arbitrary bytes as a finish request: see `respcoord_fuzz::finish`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::finish(data));
