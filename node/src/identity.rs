//! The node's identity: one ed25519 key that is both its libp2p identity
//! (PeerId) and its ledger signer (NodeId).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use libp2p::{PeerId, identity};
use ragtag_protocol::{Keypair, NodeId};

/// Identity file errors.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a ragtag identity.
    #[error("{0}: not a ragtag identity file (expected 64 hex digits of an ed25519 secret key)")]
    Malformed(PathBuf),
    /// The OS could not provide randomness.
    #[error("no OS randomness: {0}")]
    Random(String),
}

/// A fresh key from the OS's randomness.
pub fn generate() -> Result<Keypair, IdentityError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| IdentityError::Random(e.to_string()))?;
    Ok(Keypair::from_secret(secret))
}

/// Writes `key` to `path` (hex secret, file mode 0600, created atomically).
pub fn save(key: &Keypair, path: &Path) -> Result<(), IdentityError> {
    let io = |source| IdentityError::Io { path: path.into(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
        writeln!(f, "{}", hex::encode(key.secret())).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// Reads a key written by [`save`].
pub fn load(path: &Path) -> Result<Keypair, IdentityError> {
    let text = std::fs::read_to_string(path).map_err(|source| IdentityError::Io { path: path.into(), source })?;
    let mut secret = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut secret).map_err(|_| IdentityError::Malformed(path.into()))?;
    Ok(Keypair::from_secret(secret))
}

/// Loads the key at `path`, creating it first if it does not exist.
pub fn load_or_create(path: &Path) -> Result<Keypair, IdentityError> {
    if path.exists() {
        return load(path);
    }
    let key = generate()?;
    save(&key, path)?;
    Ok(key)
}

/// The same key as a libp2p identity.
pub fn libp2p_keypair(key: &Keypair) -> identity::Keypair {
    let mut secret = key.secret();
    identity::Keypair::ed25519_from_bytes(&mut secret).expect("a 32-byte ed25519 secret is always valid")
}

/// The PeerId of a node (none when the id is not a valid ed25519 key).
pub fn peer_id(node: &NodeId) -> Option<PeerId> {
    let public = identity::ed25519::PublicKey::try_from_bytes(&node.0).ok()?;
    Some(PeerId::from_public_key(&identity::PublicKey::from(public)))
}

/// The NodeId behind an ed25519 PeerId (they inline their public key).
pub fn node_id(peer: &PeerId) -> Option<NodeId> {
    let mh = peer.as_ref();
    if mh.code() != 0x00 {
        return None;
    }
    let public = identity::PublicKey::try_decode_protobuf(mh.digest()).ok()?;
    let ed = public.try_into_ed25519().ok()?;
    Some(NodeId(ed.to_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_id_and_node_id_agree() {
        let k = generate().unwrap();
        let lk = libp2p_keypair(&k);
        let pid = PeerId::from(lk.public());
        assert_eq!(peer_id(&k.node_id()), Some(pid));
        assert_eq!(node_id(&pid), Some(k.node_id()));
    }

    #[test]
    fn saved_keys_are_private_and_round_trip() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key");
        let k = load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load(&path).unwrap().node_id(), k.node_id());
        assert_eq!(load_or_create(&path).unwrap().node_id(), k.node_id());
        std::fs::write(&path, "nope").unwrap();
        assert!(matches!(load(&path), Err(IdentityError::Malformed(_))));
    }
}
