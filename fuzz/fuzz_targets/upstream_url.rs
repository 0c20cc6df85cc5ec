//! `parse_upstream_url` (Tunnel `upstream.url`, a user-written string) must
//! never panic, and what it accepts must name a host.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tuna_operator::plan::service::parse_upstream_url;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = parse_upstream_url(url) {
        // Accepted URLs parse again the same way.
        let again = parse_upstream_url(url).expect("deterministic");
        assert_eq!(format!("{parsed:?}"), format!("{again:?}"));
    }
});
