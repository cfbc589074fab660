#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    pgwal_protocol::fuzzing::decode_everything(data);
});
