//! The names of things: nodes, runs, updates, payloads.

use std::fmt;

use serde::{Deserialize, Serialize};

/// 32 bytes as hex in human-readable formats (JSON, TOML) and as raw bytes
/// in binary ones (postcard, the wire and the run id).
mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() { s.serialize_str(&hex::encode(v)) } else { serde_bytes::serialize(v, s) }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        if d.is_human_readable() {
            let text = String::deserialize(d)?;
            let mut out = [0u8; 32];
            hex::decode_to_slice(text.trim(), &mut out).map_err(D::Error::custom)?;
            Ok(out)
        } else {
            serde_bytes::deserialize(d)
        }
    }
}

/// A 32-byte blake3 digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Hash32(#[serde(with = "hex32")] pub [u8; 32]);

impl Hash32 {
    /// The blake3 digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Hash32(*blake3::hash(bytes).as_bytes())
    }

    /// Lower-case hex, 64 digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out).ok()?;
        Some(Hash32(out))
    }
}

impl fmt::Debug for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &self.to_hex()[..12])
    }
}

impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A node's identity: its ed25519 public key. The same key is the node's
/// libp2p identity, so its PeerId and its ledger signer always agree.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeId(#[serde(with = "hex32")] pub [u8; 32]);

/// Byte order (lexicographic), decided eight bytes at a time as one
/// integer: the engine's ordered maps compare node ids on every update, and
/// a 32-byte `memcmp` call per comparison was the largest single cost of a
/// 1,000-node simulation (a lookup that finds its key compares all 32).
impl Ord for NodeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let word = |id: &NodeId, i: usize| u64::from_be_bytes(id.0[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        (0..4).map(|i| word(self, i).cmp(&word(other, i))).find(|o| o.is_ne()).unwrap_or(std::cmp::Ordering::Equal)
    }
}

impl PartialOrd for NodeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl NodeId {
    /// Lower-case hex of the public key.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        Hash32::from_hex(s).map(|h| NodeId(h.0))
    }

    /// A short prefix for logs.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node:{}", self.short())
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A training run: the blake3 hash of the canonical encoding of its
/// manifest. Messages of another run are rejected.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct RunId(pub Hash32);

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run:{:?}", self.0)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// An update is named by who made it and which of its rounds it closes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UpdateId {
    /// The contributor.
    pub src: NodeId,
    /// The contributor's round number.
    pub round: u64,
}

impl fmt::Debug for UpdateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.src.short(), self.round)
    }
}

impl fmt::Display for UpdateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The fast comparison is exactly byte order, so every ordered map
        /// iterates as before (same seed, same run).
        #[test]
        fn node_id_order_is_byte_order(a in any::<[u8; 32]>(), b in any::<[u8; 32]>(), shared in 0usize..32) {
            let mut b = b;
            b[..shared].copy_from_slice(&a[..shared]);
            prop_assert_eq!(NodeId(a).cmp(&NodeId(b)), a.cmp(&b));
            prop_assert_eq!(NodeId(a).cmp(&NodeId(a)), std::cmp::Ordering::Equal);
        }
    }

    #[test]
    fn ids_are_hex_in_json_and_bytes_on_the_wire() {
        let n = NodeId([0xab; 32]);
        let json = serde_json::to_string(&n).unwrap();
        assert_eq!(json, format!("\"{}\"", "ab".repeat(32)));
        assert_eq!(serde_json::from_str::<NodeId>(&json).unwrap(), n);
        let wire = postcard::to_allocvec(&n).unwrap();
        assert_eq!(wire.len(), 33);
        assert_eq!(postcard::from_bytes::<NodeId>(&wire).unwrap(), n);
        assert!(serde_json::from_str::<Hash32>("\"zz\"").is_err());
    }
}
