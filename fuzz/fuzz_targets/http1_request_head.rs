//! The request-head parser both hops share (`tuna-http1`) must never
//! panic, and must judge a head the same whatever follows it or however
//! it was cut: a complete head parses the same alone, any strict prefix of
//! it is incomplete (never an error, never another head).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tuna_http1::{MAX_HEAD, Request, header_buf, parse_request};

fn summary(r: &Request<'_, '_>) -> String {
    format!(
        "{} {} {} {} {:?} {:?} {} {} {} {} {}",
        r.len,
        r.method,
        r.target,
        r.minor,
        r.host,
        r.framing,
        r.close,
        r.upgrade,
        r.expect,
        r.te_trailers,
        r.headers.len()
    )
}

fuzz_target!(|data: &[u8]| {
    let mut storage = header_buf();
    let Ok(Some(req)) = parse_request(data, &mut storage, MAX_HEAD) else {
        return;
    };
    assert!(req.len <= data.len() && req.len <= MAX_HEAD);
    let whole = summary(&req);
    for h in req.headers {
        let _ = req.is_hop_by_hop(h.name);
    }
    if let Some(host) = req.host {
        assert!(tuna_http1::parse_host(host.value.as_bytes()).is_some());
        assert!(host.is(host.name));
    }
    let len = req.len;
    let mut storage = header_buf();
    let alone = parse_request(&data[..len], &mut storage, MAX_HEAD)
        .expect("the head alone parses")
        .expect("and is complete");
    assert_eq!(summary(&alone), whole);
    let cut = usize::from(data[0]) * 257 % len;
    let mut storage = header_buf();
    assert!(matches!(
        parse_request(&data[..cut], &mut storage, MAX_HEAD),
        Ok(None)
    ));
});
