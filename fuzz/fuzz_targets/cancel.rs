//! Arbitrary bytes as a cancel request: see `respcoord_fuzz::cancel`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::cancel(data));
