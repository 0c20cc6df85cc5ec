//! A token bucket per API key: `burst` requests at once, refilled at
//! `per_second`. Keyed by key id, so one noisy reconciler cannot starve
//! another account's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Request budget of one API key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Requests admitted back to back after an idle period (at least 1).
    pub burst: u32,
    /// Sustained requests per second (must be positive).
    pub per_second: f64,
}

impl Default for RateLimit {
    /// 60 at once, 20 per second: far above what a reconciler needs, low
    /// enough that a runaway loop is noticed.
    fn default() -> Self {
        Self {
            burst: 60,
            per_second: 20.0,
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The buckets of every key seen.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    /// A limiter applying `limit` to every key.
    pub fn new(limit: RateLimit) -> Self {
        let limit = RateLimit {
            burst: limit.burst.max(1),
            per_second: if limit.per_second > 0.0 {
                limit.per_second
            } else {
                f64::MIN_POSITIVE
            },
        };
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `key`'s bucket; `Err(wait)` when it is empty.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        self.take_at(key, Instant::now(), true)
    }

    /// Whether `key`'s bucket holds a token, without taking it (`Err(wait)`
    /// when empty): for budgets spent only by failures.
    pub fn peek(&self, key: &str) -> Result<(), Duration> {
        self.take_at(key, Instant::now(), false)
    }

    #[cfg(test)]
    fn check_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        self.take_at(key, now, true)
    }

    fn take_at(&self, key: &str, now: Instant, take: bool) -> Result<(), Duration> {
        let burst = f64::from(self.limit.burst);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            // Keys are client addresses too: forget the buckets that have
            // refilled (they hold no information), so the map stays bounded.
            let per_second = self.limit.per_second;
            buckets.retain(|_, b| {
                let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
                b.tokens + elapsed * per_second < burst
            });
            if buckets.len() >= MAX_BUCKETS {
                buckets.clear();
            }
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.limit.per_second).min(burst);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            if take {
                bucket.tokens -= 1.0;
            }
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / self.limit.per_second;
            Err(Duration::from_secs_f64(wait.min(86_400.0)))
        }
    }
}

/// Most buckets kept before refilled ones are forgotten.
const MAX_BUCKETS: usize = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_admits_burst_then_refills() {
        let limiter = RateLimiter::new(RateLimit {
            burst: 2,
            per_second: 1.0,
        });
        let t0 = Instant::now();
        assert!(limiter.check_at("k", t0).is_ok());
        assert!(limiter.check_at("k", t0).is_ok());
        let wait = limiter.check_at("k", t0).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        // Another key has its own bucket.
        assert!(limiter.check_at("other", t0).is_ok());
        assert!(limiter.check_at("k", t0 + Duration::from_secs(1)).is_ok());
        assert!(limiter.check_at("k", t0 + Duration::from_secs(1)).is_err());
    }
}
