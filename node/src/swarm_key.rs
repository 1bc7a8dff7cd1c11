//! Private swarms: the pre-shared key in the IPFS `swarm.key` format
//! (`/key/swarm/psk/1.0.0/`, `/base16/`, 64 hex digits).

use std::{path::Path, str::FromStr};

use libp2p::pnet::{KeyParseError, PreSharedKey};

/// Swarm key errors.
#[derive(Debug, thiserror::Error)]
pub enum SwarmKeyError {
    /// The file cannot be read or written.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The file is not a swarm key.
    #[error("{0}: not a swarm key (expected /key/swarm/psk/1.0.0/, /base16/ and 64 hex digits): {1}")]
    Malformed(String, #[source] KeyParseError),
    /// No OS randomness.
    #[error("no OS randomness: {0}")]
    Random(String),
}

/// A new random swarm key in the IPFS text format.
pub fn generate() -> Result<String, SwarmKeyError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| SwarmKeyError::Random(e.to_string()))?;
    Ok(format!("/key/swarm/psk/1.0.0/\n/base16/\n{}\n", hex::encode(key)))
}

/// Reads a swarm key file.
pub fn load(path: &Path) -> Result<PreSharedKey, SwarmKeyError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SwarmKeyError::Io(name.clone(), e))?;
    parse(&text).map_err(|e| SwarmKeyError::Malformed(name, e))
}

/// Parses the IPFS swarm key format.
pub fn parse(text: &str) -> Result<PreSharedKey, KeyParseError> {
    PreSharedKey::from_str(text.trim())
}

/// Writes a key file with mode 0600.
pub fn save(text: &str, path: &Path) -> Result<(), SwarmKeyError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let name = path.display().to_string();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| SwarmKeyError::Io(name.clone(), e))?;
    f.write_all(text.as_bytes()).map_err(|e| SwarmKeyError::Io(name, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_differ() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        let ka = parse(&a).unwrap();
        assert_ne!(ka.fingerprint().to_string(), parse(&b).unwrap().fingerprint().to_string());
        assert!(parse("/key/swarm/psk/1.0.0/\n/base16/\n1234").is_err());
        assert!(parse("garbage").is_err());
    }
}
