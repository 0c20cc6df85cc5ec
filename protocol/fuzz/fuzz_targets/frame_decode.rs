//! The frame decoder must never panic, allocate past the frame limit, or
//! accept a frame it cannot re-encode to the same value.
//! `cargo +nightly fuzz run frame_decode` (from `protocol/`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tuna_protocol::wire::{Frame, MAX_FRAME_LEN, Preamble};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((frame, used))) = Frame::decode(data) {
        assert!(used <= data.len() && used <= 4 + MAX_FRAME_LEN);
        let again = frame.encode().expect("a decoded frame re-encodes");
        let (back, _) = Frame::decode(&again).expect("re-decodes").expect("complete");
        assert_eq!(back, frame);
    }
    if let Ok(bytes) = <&[u8; Preamble::LEN]>::try_from(data.get(..Preamble::LEN).unwrap_or_default()) {
        let _ = Preamble::decode(bytes);
    }
});
