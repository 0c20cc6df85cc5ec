//! The response-head parser both hops share must never panic, and must
//! judge a head the same alone as with bytes after it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tuna_http1::{Framing, Response, header_buf, parse_response};

fn summary(r: &Response<'_, '_>) -> String {
    format!(
        "{} {} {} {:?} {} {} {}",
        r.len,
        r.minor,
        r.status,
        r.framing,
        r.close,
        r.conflicting_length,
        r.headers.len()
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    let is_head = flags & 1 == 1;
    let mut storage = header_buf();
    let Ok(Some(resp)) = parse_response(data, &mut storage, is_head) else {
        return;
    };
    assert!(resp.len <= data.len());
    if is_head || resp.status == 204 || resp.status == 304 || (100..200).contains(&resp.status) {
        assert_eq!(resp.framing, Framing::Empty);
    }
    if resp.conflicting_length {
        assert!(resp.is_hop_by_hop("content-length"));
    }
    let whole = summary(&resp);
    let len = resp.len;
    let mut storage = header_buf();
    let alone = parse_response(&data[..len], &mut storage, is_head)
        .expect("the head alone parses")
        .expect("and is complete");
    assert_eq!(summary(&alone), whole);
});
