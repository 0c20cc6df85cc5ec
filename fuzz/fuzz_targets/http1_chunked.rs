//! The body tracker (chunked decoder) both hops share, against itself
//! under read splits: fed in one piece or in three, it must reach the same
//! verdict — the same end at the same byte, or an error — and never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tuna_http1::{BodyTracker, Framing};

/// Feeds `input` cut at `cuts`; returns where the body ended, or `None`
/// when it did not end, or `Err` on a framing error.
fn feed(input: &[u8], cuts: &[usize]) -> Result<Option<usize>, ()> {
    let mut tracker = BodyTracker::new(Framing::Chunked);
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    bounds.push(input.len());
    bounds.sort_unstable();
    let mut start = 0;
    for end in bounds {
        let piece = &input[start..end];
        let n = tracker.feed(piece).map_err(|_| ())?;
        if tracker.is_done() {
            return Ok(Some(start + n));
        }
        assert_eq!(n, piece.len(), "an unfinished body takes its whole piece");
        start = end;
    }
    Ok(None)
}

fuzz_target!(|data: &[u8]| {
    let Some((cuts, input)) = data.split_at_checked(2) else {
        return;
    };
    let one = feed(input, &[]);
    let split = feed(input, &[usize::from(cuts[0]) * 31, usize::from(cuts[1]) * 17]);
    assert_eq!(one, split);
    let byte_by_byte = feed(input, &(0..input.len()).collect::<Vec<_>>());
    assert_eq!(one, byte_by_byte);
    if let Ok(Some(end)) = one {
        assert!(end <= input.len());
    }
});
