//! Character-level text: any UTF-8 file; the vocabulary is the sorted set
//! of characters in the file; the last tenth is held out.

use std::{collections::BTreeMap, path::Path};

use ragtag_protocol::{ids::Hash32, rng::SeededRng};

use super::{Batch, Inputs, Shard};
use crate::{Error, Result};

/// A text file as character ids.
#[derive(Debug)]
pub(crate) struct Corpus {
    pub(crate) vocab: Vec<char>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) hash: Hash32,
}

impl Corpus {
    /// Reads and tokenises a file.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.into(), source })?;
        Self::from_bytes(path, &bytes)
    }

    pub(crate) fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(bytes).map_err(|e| Error::Malformed {
            path: path.into(),
            at: format!("byte {}", e.valid_up_to()),
            message: "not valid UTF-8".into(),
        })?;
        if text.chars().count() < 2 {
            return Err(Error::Empty { path: path.into(), message: "needs at least two characters of text".into() });
        }
        let vocab: Vec<char> = text.chars().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let index: BTreeMap<char, u32> = vocab.iter().enumerate().map(|(i, c)| (*c, i as u32)).collect();
        let tokens = text.chars().map(|c| index[&c]).collect();
        Ok(Self { vocab, tokens, hash: Hash32::of(bytes) })
    }

    /// Entropy of the character frequencies (nats): what a model that
    /// ignores context achieves at best.
    pub(crate) fn unigram_entropy(&self) -> f32 {
        let mut counts = vec![0u64; self.vocab.len()];
        for t in &self.tokens {
            counts[*t as usize] += 1;
        }
        let n = self.tokens.len() as f64;
        counts.iter().filter(|c| **c > 0).map(|c| *c as f64 / n).map(|p| -p * p.ln()).sum::<f64>() as f32
    }

    /// The first nine tenths for training; held-out windows from the rest.
    pub(crate) fn split(&self, context: usize, eval_samples: usize) -> (Vec<u32>, Batch) {
        let cut = self.tokens.len() * 9 / 10;
        let train = self.tokens[..cut].to_vec();
        let held = &self.tokens[cut..];
        let mut data = Vec::new();
        let mut targets = Vec::new();
        for w in held.windows(context + 1).step_by(context).take(eval_samples.max(1)) {
            data.extend_from_slice(&w[..context]);
            targets.extend_from_slice(&w[1..]);
        }
        (train, Batch { inputs: Inputs::Tokens { data, len: context }, targets })
    }
}

/// `n` random windows from this shard's contiguous part of the tokens.
pub(crate) fn random_windows(tokens: &[u32], n: usize, context: usize, shard: Shard, rng: &mut SeededRng) -> Batch {
    let part = tokens.len() / shard.count.max(1) as usize;
    let (lo, len) = if part > context + 1 { (shard.index as usize * part, part) } else { (0, tokens.len()) };
    let span = len.saturating_sub(context + 1).max(1) as u64;
    let mut data = Vec::with_capacity(n * context);
    let mut targets = Vec::with_capacity(n * context);
    for _ in 0..n {
        let s = lo + rng.below(span) as usize;
        let w = &tokens[s..(s + context + 1).min(tokens.len())];
        data.extend_from_slice(&w[..context.min(w.len() - 1)]);
        targets.extend_from_slice(&w[1..]);
    }
    Batch { inputs: Inputs::Tokens { data, len: context }, targets }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_split_and_errors() {
        let p = Path::new("mem.txt");
        let c = Corpus::from_bytes(p, b"abcabcabcabcabcabcabcabcabcabcabcabcabcabd").unwrap();
        assert_eq!(c.vocab, vec!['a', 'b', 'c', 'd']);
        let (train, eval) = c.split(3, 10);
        assert_eq!(train.len(), c.tokens.len() * 9 / 10);
        assert_eq!(eval.targets.len(), eval.samples() * 3);
        let e = Corpus::from_bytes(p, &[b'a', 0xff, b'b']).unwrap_err();
        assert!(e.to_string().contains("byte 1"), "{e}");
        assert!(matches!(Corpus::from_bytes(p, b"a"), Err(Error::Empty { .. })));
        assert!((c.unigram_entropy() - 1.2).abs() < 0.2);
    }

    #[test]
    fn windows_stay_in_their_shard() {
        let tokens: Vec<u32> = (0..1000).collect();
        let mut rng = SeededRng::new(1);
        let b = random_windows(&tokens, 50, 8, Shard { index: 2, count: 4 }, &mut rng);
        let Inputs::Tokens { data, .. } = &b.inputs else { unreachable!() };
        assert!(data.iter().all(|t| (500..750).contains(t)));
        assert_eq!(b.targets.len(), 50 * 8);
    }
}
