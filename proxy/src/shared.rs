//! State shared by every connection of one proxy core, whichever path
//! (fast path or Pingora) serves it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use arc_swap::ArcSwap;
use http::HeaderValue;

use crate::config::ProxyConfig;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::routes::Snapshot;

/// State shared by every connection of one proxy core.
pub(crate) struct Shared {
    pub(crate) snapshot: ArcSwap<Snapshot>,
    pub(crate) metrics: Metrics,
    pub(crate) config: ProxyConfig,
    /// Idle upstream connections of the HTTP/1.1 fast path.
    pub(crate) pool: Pool,
    id_prefix: u32,
    id_counter: AtomicU64,
}

impl Shared {
    pub(crate) fn new(config: ProxyConfig) -> Self {
        // A per-process prefix keeps ids of restarted processes apart
        // without a random-number dependency.
        let id_prefix = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
            );
            h.finish() as u32
        };
        Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            metrics: Metrics::default(),
            pool: Pool::new(config.upstream_pool_size, config.upstream.idle),
            config,
            id_prefix,
            id_counter: AtomicU64::new(0),
        }
    }

    pub(crate) fn next_request_id(&self) -> HeaderValue {
        let mut id = [0u8; 24];
        self.write_request_id(&mut id);
        HeaderValue::from_bytes(&id).expect("hex is a valid header value")
    }

    /// Writes the next request id into `id` (24 bytes): 8 hex digits of
    /// prefix, 16 of counter, in place — this runs for every request, so
    /// no `format!` String in between.
    pub(crate) fn write_request_id(&self, id: &mut [u8]) {
        let n = self.id_counter.fetch_add(1, Relaxed);
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digits = (u128::from(self.id_prefix) << 64) | u128::from(n);
        for (i, b) in id.iter_mut().take(24).enumerate() {
            *b = HEX[((digits >> (4 * (23 - i))) & 0xf) as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place hex writer must produce what `format!` would: the id
    /// prefix then the counter, zero-padded lowercase hex.
    #[test]
    fn request_ids_are_prefix_then_counter_in_hex() {
        let shared = Shared::new(ProxyConfig::default());
        shared.id_counter.store(0x0123_4567_89ab_cdef, Relaxed);
        let first = shared.next_request_id();
        let second = shared.next_request_id();
        let expect = |n: u64| format!("{:08x}{:016x}", shared.id_prefix, n);
        assert_eq!(first.to_str().unwrap(), expect(0x0123_4567_89ab_cdef));
        assert_eq!(second.to_str().unwrap(), expect(0x0123_4567_89ab_cdf0));
    }
}
