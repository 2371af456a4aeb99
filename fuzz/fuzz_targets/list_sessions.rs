//! Arbitrary bytes as a list_sessions request: see `respcoord_fuzz::list_sessions`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::list_sessions(data));
