//! Arbitrary bytes as a get_state request: see `respcoord_fuzz::get_state`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::get_state(data));
