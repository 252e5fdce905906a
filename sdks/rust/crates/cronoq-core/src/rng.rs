//! The engine's one source of randomness (retry jitter), injected so that a test can give both
//! engines the same numbers. `MersenneTwister` reproduces Python's `random.Random(seed)`
//! exactly for integer seeds: MT19937 seeded by `init_by_array` with the seed's 32-bit words,
//! and `random()` as 53 bits from two outputs, so a seeded Rust engine jitters as a seeded
//! Python engine does.

/// A source of uniform floats in [0, 1).
pub trait Random {
    /// The next float in [0, 1) (Python's `random.random()`).
    fn random(&mut self) -> f64;

    /// A float between `a` and `b`, computed as Python's `random.uniform`: `a + (b-a) * r`.
    fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }
}

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// MT19937 as CPython's `_random` module runs it.
#[derive(Clone)]
pub struct MersenneTwister {
    mt: Box<[u32; N]>,
    index: usize,
}

impl std::fmt::Debug for MersenneTwister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MersenneTwister")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl MersenneTwister {
    /// The generator of `random.Random(seed)`: the absolute value of the seed split into 32-bit
    /// words, least significant first (`[0]` for zero), fed to `init_by_array`.
    pub fn new(seed: i128) -> Self {
        let mut n = seed.unsigned_abs();
        let mut key = Vec::new();
        while n > 0 {
            key.push(n as u32);
            n >>= 32;
        }
        if key.is_empty() {
            key.push(0);
        }
        let mut g = MersenneTwister {
            mt: Box::new([0; N]),
            index: N,
        };
        g.init_by_array(&key);
        g
    }

    fn init_genrand(&mut self, s: u32) {
        let mt = &mut self.mt;
        mt[0] = s;
        for i in 1..N {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let mt = &mut self.mt;
        let (mut i, mut j) = (1usize, 0usize);
        let mut k = N.max(key.len());
        while k > 0 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
            k -= 1;
        }
        k = N - 1;
        while k > 0 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            k -= 1;
        }
        mt[0] = 0x8000_0000;
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            let mt = &mut self.mt;
            for kk in 0..N {
                let y = (mt[kk] & UPPER_MASK) | (mt[(kk + 1) % N] & LOWER_MASK);
                let mag = if y & 1 == 0 { 0 } else { MATRIX_A };
                mt[kk] = mt[(kk + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

impl Random for MersenneTwister {
    fn random(&mut self) -> f64 {
        let a = self.next_u32() >> 5;
        let b = self.next_u32() >> 6;
        (f64::from(a) * 67_108_864.0 + f64::from(b)) * (1.0 / 9_007_199_254_740_992.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_python_random() {
        // `[random.Random(s).random() for _ in range(3)]` for these seeds, from CPython 3.11.
        let cases: [(i128, [f64; 3]); 4] = [
            (
                0,
                [0.8444218515250481, 0.7579544029403025, 0.420571580830845],
            ),
            (
                1,
                [0.13436424411240122, 0.8474337369372327, 0.763774618976614],
            ),
            (
                42,
                [
                    0.6394267984578837,
                    0.025010755222666936,
                    0.27502931836911926,
                ],
            ),
            (
                -7,
                [0.32383276483316237, 0.15084917392450192, 0.6509344730398537],
            ),
        ];
        for (seed, want) in cases {
            let mut g = MersenneTwister::new(seed);
            for w in want {
                assert_eq!(g.random().to_bits(), w.to_bits(), "seed {seed}");
            }
        }
    }

    #[test]
    fn large_seeds_use_every_word() {
        // random.Random(2**64 + 5).random(), then random.Random(5).random()
        let mut g = MersenneTwister::new((1i128 << 64) + 5);
        assert_eq!(g.random().to_bits(), 0.5105783769365112f64.to_bits());
        let mut g = MersenneTwister::new(5);
        assert_eq!(g.random().to_bits(), 0.6229016948897019f64.to_bits());
    }

    #[test]
    fn uniform_is_a_plus_span_times_random() {
        let mut a = MersenneTwister::new(3);
        let mut b = MersenneTwister::new(3);
        let r = b.random();
        assert_eq!(a.uniform(2.0, 5.0).to_bits(), (2.0 + 3.0 * r).to_bits());
    }
}
