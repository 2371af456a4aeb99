//! Arbitrary bytes as a shutdown request: see `respcoord_fuzz::shutdown`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| respcoord_fuzz::shutdown(data));
