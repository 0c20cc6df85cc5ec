//! A token bucket per API key: `burst` requests at once, refilled at
//! `per_second`. Keyed by key id, so one noisy reconciler cannot starve
//! another account's.
//!
//! In an edge fleet the budget is the fleet's, not each replica's: every
//! replica takes its share ([`FleetShare`]: `per_second` and `burst`
//! divided by the replicas alive, as their leases in the store say), so a
//! key's requests spread over N replicas by a load balancer are admitted at
//! the configured rate in all. (A client pinned to one replica gets that
//! replica's share: the price of not asking the database on every request.)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
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

/// How many replicas share a fleet-wide budget (1 for a single edge): set
/// by the fleet's lease task, read by every limiter of the replica.
#[derive(Clone, Debug)]
pub struct FleetShare(Arc<AtomicU32>);

impl Default for FleetShare {
    fn default() -> Self {
        Self(Arc::new(AtomicU32::new(1)))
    }
}

impl FleetShare {
    /// `replicas` alive (this one included; at least 1) share the budget.
    pub fn set(&self, replicas: usize) {
        let n = u32::try_from(replicas.max(1)).unwrap_or(u32::MAX);
        self.0.store(n, Ordering::Relaxed);
    }

    /// The replicas sharing the budget now.
    pub fn replicas(&self) -> u32 {
        self.0.load(Ordering::Relaxed).max(1)
    }
}

/// The buckets of every key seen.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    share: FleetShare,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Most buckets kept ([`MAX_BUCKETS`]; smaller in tests).
    capacity: usize,
}

impl RateLimiter {
    /// A limiter applying `limit` to every key.
    pub fn new(limit: RateLimit) -> Self {
        Self::shared(limit, FleetShare::default())
    }

    /// A limiter applying this replica's share of the fleet's `limit`.
    pub fn shared(limit: RateLimit, share: FleetShare) -> Self {
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
            share,
            buckets: Mutex::new(HashMap::new()),
            capacity: MAX_BUCKETS,
        }
    }

    /// Takes one request from `key`'s bucket; `Err(wait)` when it is empty.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        self.take_at(key, Instant::now(), true)
    }

    /// Gives back one request taken by [`RateLimiter::check`] (what was
    /// charged in advance turned out not to be spent): up to the burst.
    pub fn refund(&self, key: &str) {
        let (burst, _) = self.current();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bucket) = buckets.get_mut(key) {
            bucket.tokens = (bucket.tokens + 1.0).min(burst);
        }
    }

    /// Whether `key`'s bucket holds a token, without taking it.
    #[cfg(test)]
    pub(crate) fn peek(&self, key: &str) -> Result<(), Duration> {
        self.take_at(key, Instant::now(), false)
    }

    #[cfg(test)]
    fn check_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        self.take_at(key, now, true)
    }

    /// This replica's share of the limit: the rate divided by the replicas
    /// alive, the burst too (at least one request).
    fn current(&self) -> (f64, f64) {
        let n = f64::from(self.share.replicas());
        (
            (f64::from(self.limit.burst) / n).max(1.0),
            self.limit.per_second / n,
        )
    }

    fn take_at(&self, key: &str, now: Instant, take: bool) -> Result<(), Duration> {
        let (burst, per_second) = self.current();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= self.capacity && !buckets.contains_key(key) {
            // Keys are client addresses too: forget the buckets that have
            // refilled (they hold no information), so the map stays bounded.
            buckets.retain(|_, b| {
                let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
                b.tokens + elapsed * per_second < burst
            });
            if buckets.len() >= self.capacity {
                evict_least_recent(&mut buckets, self.capacity);
            }
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            if take {
                bucket.tokens -= 1.0;
            }
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / per_second;
            Err(Duration::from_secs_f64(wait.min(86_400.0)))
        }
    }
}

/// Most buckets kept before refilled ones are forgotten.
const MAX_BUCKETS: usize = 100_000;

/// Makes room in a full map by forgetting the buckets touched longest ago,
/// a sixteenth of `capacity` at once (at least one) so that a flood of new
/// keys sorts the map rarely. Never all of them: clearing the map would
/// hand every drained bucket (the very clients being throttled) a fresh
/// budget, and a flood of new keys would buy exactly that.
fn evict_least_recent(buckets: &mut HashMap<String, Bucket>, capacity: usize) {
    let evict = (buckets.len() + 1)
        .saturating_sub(capacity)
        .max(capacity / 16)
        .clamp(1, buckets.len());
    let mut ages: Vec<Instant> = buckets.values().map(|b| b.last).collect();
    let cutoff = *ages.select_nth_unstable(evict - 1).1;
    let mut left = evict;
    buckets.retain(|_, b| {
        if left > 0 && b.last <= cutoff {
            left -= 1;
            false
        } else {
            true
        }
    });
}

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

    /// A full table used to be cleared, which gave every drained bucket
    /// (the addresses being throttled) a fresh budget; now only the buckets
    /// touched longest ago are forgotten.
    #[test]
    fn a_full_table_forgets_the_oldest_buckets_not_the_throttled_ones() {
        let mut limiter = RateLimiter::new(RateLimit {
            burst: 1,
            per_second: 0.001,
        });
        limiter.capacity = 4;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for (i, key) in ["old-1", "old-2", "old-3"].into_iter().enumerate() {
            assert!(limiter.check_at(key, at(i as u64)).is_ok());
        }
        assert!(limiter.check_at("throttled", at(10)).is_ok());
        assert!(limiter.check_at("throttled", at(10)).is_err());
        // The table is full (four drained buckets): a new key makes room.
        assert!(limiter.check_at("new", at(11)).is_ok());
        assert!(
            limiter.check_at("throttled", at(12)).is_err(),
            "a recently throttled client keeps its empty bucket"
        );
        let buckets = limiter.buckets.lock().unwrap();
        assert!(!buckets.contains_key("old-1"), "the oldest is forgotten");
        assert!(buckets.contains_key("old-3") && buckets.contains_key("new"));
        assert!(buckets.len() <= 4);
    }

    #[test]
    fn replicas_of_a_fleet_each_admit_their_share_of_the_budget() {
        let share = FleetShare::default();
        let limit = RateLimit {
            burst: 6,
            per_second: 3.0,
        };
        let (a, b, c) = (
            RateLimiter::shared(limit, share.clone()),
            RateLimiter::shared(limit, share.clone()),
            RateLimiter::shared(limit, share.clone()),
        );
        let admitted =
            |l: &RateLimiter, at: Instant| (0..100).filter(|_| l.check_at("k", at).is_ok()).count();
        let t0 = Instant::now();
        // Alone: the whole burst.
        assert_eq!(admitted(&a, t0), 6);
        // Three replicas alive: a fresh key's burst is 6 fleet-wide, 2 each,
        // and a second refills one request per replica (3/s in all).
        share.set(3);
        let k = "fresh";
        let fleet = |at: Instant| {
            [&a, &b, &c]
                .iter()
                .map(|l| (0..100).filter(|_| l.check_at(k, at).is_ok()).count())
                .sum::<usize>()
        };
        assert_eq!(fleet(t0), 6);
        assert_eq!(fleet(t0 + Duration::from_secs(1)), 3);
        // A replica gone: the two left share it.
        share.set(2);
        assert_eq!(share.replicas(), 2);
        assert_eq!(
            fleet(t0 + Duration::from_secs(10)),
            9,
            "each limiter refills to the new share, 3"
        );
    }
}
