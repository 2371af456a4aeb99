//! Arbitrary bytes as a watch request: see `respcoord_fuzz::watch`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::watch(data));
