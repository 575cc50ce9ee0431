//! A small seeded random generator (SplitMix64) for randomized tests. The seed comes from an
//! environment variable when set (to replay a run) or from the clock, and the test prints it.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The seed in `var` (decimal or `0x` hex), else one from the clock; with the seed used.
    pub fn from_env(var: &str) -> (Rng, u64) {
        let parse = |v: &str| {
            let v = v.trim();
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            }
        };
        let seed = match std::env::var(var) {
            Ok(v) => parse(&v).unwrap_or_else(|| panic!("{var}={v:?} is not a number")),
            Err(_) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap();
                now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
            }
        };
        (Rng::new(seed), seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A duration in `lo..=hi`, to the millisecond.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        Duration::from_millis(self.range(lo.as_millis() as u64, hi.as_millis() as u64))
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    /// An index drawn with the given weights.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < u64::from(*w) {
                return i;
            }
            x -= u64::from(*w);
        }
        unreachable!("weights add up")
    }

    /// An independent generator derived from this one (for another task).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

#[test]
fn the_same_seed_gives_the_same_draws() {
    let (mut a, mut b) = (Rng::new(7), Rng::new(7));
    let xs: Vec<u64> = (0..100).map(|_| a.range(3, 9)).collect();
    let ys: Vec<u64> = (0..100).map(|_| b.range(3, 9)).collect();
    assert_eq!(xs, ys);
    assert!(xs.iter().all(|x| (3..=9).contains(x)));
    assert!((3..=9).all(|v| xs.contains(&v)), "every value drawn: {xs:?}");
}
