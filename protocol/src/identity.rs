//! Keys and domain-separated signatures.
//!
//! libp2p signs its own handshakes with the same ed25519 key, so every
//! payload we sign is prefixed by a domain string of its own
//! (`ragtag/v1/update`, ...): a signature made for one purpose can never be
//! replayed as another. Verification uses `verify_strict` (rejects weak keys
//! and malleable signatures).

use std::{fmt, marker::PhantomData};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::ids::{Hash32, NodeId};

/// Why a signed value could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The body is not a valid encoding of the expected type.
    #[error("malformed signed body: {0}")]
    Malformed(String),
    /// The claimed signer is not a valid ed25519 public key.
    #[error("signer is not a valid ed25519 key")]
    BadKey,
    /// The signature does not verify under the signer's key and domain.
    #[error("signature does not verify")]
    BadSignature,
}

/// A node's signing key.
#[derive(Clone)]
pub struct Keypair {
    signing: SigningKey,
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keypair({:?})", self.node_id())
    }
}

impl Keypair {
    /// The key with this 32-byte secret (seed).
    pub fn from_secret(secret: [u8; 32]) -> Self {
        Self { signing: SigningKey::from_bytes(&secret) }
    }

    /// A key derived from a seed and an index: deterministic identities for
    /// the simulator and tests. Never use for a real node.
    pub fn deterministic(seed: u64, index: u64) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"ragtag/v1/test-key");
        h.update(&seed.to_le_bytes());
        h.update(&index.to_le_bytes());
        Self::from_secret(*h.finalize().as_bytes())
    }

    /// The 32-byte secret, for storing the identity.
    pub fn secret(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// The public identity.
    pub fn node_id(&self) -> NodeId {
        NodeId(self.signing.verifying_key().to_bytes())
    }

    /// Signs `domain || message`.
    pub fn sign(&self, domain: &[u8], message: &[u8]) -> [u8; 64] {
        let mut buf = Vec::with_capacity(domain.len() + message.len());
        buf.extend_from_slice(domain);
        buf.extend_from_slice(message);
        self.signing.sign(&buf).to_bytes()
    }
}

/// Verifies a signature made by [`Keypair::sign`].
pub fn verify(signer: &NodeId, domain: &[u8], message: &[u8], signature: &[u8; 64]) -> Result<(), SignatureError> {
    let key = VerifyingKey::from_bytes(&signer.0).map_err(|_| SignatureError::BadKey)?;
    let mut buf = Vec::with_capacity(domain.len() + message.len());
    buf.extend_from_slice(domain);
    buf.extend_from_slice(message);
    key.verify_strict(&buf, &Signature::from_bytes(signature)).map_err(|_| SignatureError::BadSignature)
}

/// One signature to check in a batch.
#[derive(Clone, Copy, Debug)]
pub struct SignatureCheck<'a> {
    /// Who claims to have signed.
    pub signer: NodeId,
    /// The domain string.
    pub domain: &'a [u8],
    /// The signed bytes.
    pub message: &'a [u8],
    /// The signature.
    pub signature: [u8; 64],
}

impl SignatureCheck<'_> {
    /// Checks this one signature alone.
    pub fn verify(&self) -> Result<(), SignatureError> {
        verify(&self.signer, self.domain, self.message, &self.signature)
    }
}

/// Verifies many signatures at once (faster than one by one); on failure,
/// the caller verifies one by one to name the bad one.
pub fn verify_batch(items: &[SignatureCheck<'_>]) -> Result<(), SignatureError> {
    let mut keys = Vec::with_capacity(items.len());
    let mut msgs = Vec::with_capacity(items.len());
    let mut sigs = Vec::with_capacity(items.len());
    for SignatureCheck { signer, domain, message, signature: sig } in items {
        let key = VerifyingKey::from_bytes(&signer.0).map_err(|_| SignatureError::BadKey)?;
        // Batch verification has no strict mode: reject weak keys here.
        if key.is_weak() {
            return Err(SignatureError::BadKey);
        }
        keys.push(key);
        let mut m = Vec::with_capacity(domain.len() + message.len());
        m.extend_from_slice(domain);
        m.extend_from_slice(message);
        msgs.push(m);
        sigs.push(Signature::from_bytes(sig));
    }
    let refs: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();
    ed25519_dalek::verify_batch(&refs, &sigs, &keys).map_err(|_| SignatureError::BadSignature)
}

/// A type that travels signed: it names its domain and its signer.
pub trait Signable: Serialize + DeserializeOwned {
    /// The domain string prefixed to the body before signing.
    const DOMAIN: &'static [u8];
    /// Largest accepted body, checked before decoding.
    const MAX_BODY: usize;
    /// Who must have signed it.
    fn signer(&self) -> NodeId;
}

/// A value with its exact signed bytes. The signature covers the bytes as
/// received, so verification never depends on re-encoding.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Signed<T> {
    #[serde(with = "serde_bytes")]
    body: Vec<u8>,
    #[serde(with = "serde_bytes")]
    signature: [u8; 64],
    #[serde(skip)]
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for Signed<T> {
    fn clone(&self) -> Self {
        Self { body: self.body.clone(), signature: self.signature, _type: PhantomData }
    }
}

impl<T> PartialEq for Signed<T> {
    fn eq(&self, other: &Self) -> bool {
        self.body == other.body && self.signature == other.signature
    }
}

impl<T> Eq for Signed<T> {}

impl<T> Signed<T> {
    /// The hash that names this signed value: blake3 of body and signature.
    pub fn hash(&self) -> Hash32 {
        let mut h = blake3::Hasher::new();
        h.update(&(self.body.len() as u64).to_le_bytes());
        h.update(&self.body);
        h.update(&self.signature);
        Hash32(*h.finalize().as_bytes())
    }
}

impl<T> fmt::Debug for Signed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signed<{}>({} bytes, {:?})", std::any::type_name::<T>(), self.body.len(), self.hash())
    }
}

impl<T: Signable> Signed<T> {
    /// Encodes and signs `value` with `key`.
    pub fn sign(value: &T, key: &Keypair) -> Self {
        let body = postcard::to_allocvec(value).expect("encoding to a Vec cannot fail");
        let signature = key.sign(T::DOMAIN, &body);
        Self { body, signature, _type: PhantomData }
    }

    /// Builds from parts (e.g. read from storage); nothing is checked yet.
    pub fn from_parts(body: Vec<u8>, signature: [u8; 64]) -> Self {
        Self { body, signature, _type: PhantomData }
    }

    /// Decodes the body without checking the signature.
    pub fn decode_unverified(&self) -> Result<T, SignatureError> {
        if self.body.len() > T::MAX_BODY {
            return Err(SignatureError::Malformed(format!("body of {} bytes over {}", self.body.len(), T::MAX_BODY)));
        }
        let (value, rest) =
            postcard::take_from_bytes::<T>(&self.body).map_err(|e| SignatureError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(SignatureError::Malformed(format!("{} trailing bytes", rest.len())));
        }
        Ok(value)
    }

    /// Decodes the body and checks that its own signer signed it.
    pub fn open(&self) -> Result<T, SignatureError> {
        let value = self.decode_unverified()?;
        verify(&value.signer(), T::DOMAIN, &self.body, &self.signature)?;
        Ok(value)
    }

    /// The exact signed bytes.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The signature.
    pub fn signature(&self) -> &[u8; 64] {
        &self.signature
    }

    /// Replaces the signature (tests of tampering).
    pub fn with_signature(mut self, signature: [u8; 64]) -> Self {
        self.signature = signature;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Note {
        by: NodeId,
        text: String,
    }

    impl Signable for Note {
        const DOMAIN: &'static [u8] = b"ragtag/v1/test-note";
        const MAX_BODY: usize = 1024;
        fn signer(&self) -> NodeId {
            self.by
        }
    }

    #[test]
    fn sign_open_round_trip_and_tamper() {
        let k = Keypair::deterministic(1, 0);
        let note = Note { by: k.node_id(), text: "hello".into() };
        let signed = Signed::sign(&note, &k);
        assert_eq!(signed.open().unwrap(), note);

        let mut body = signed.body().to_vec();
        let last = body.len() - 1;
        body[last] ^= 1;
        let tampered = Signed::<Note>::from_parts(body, *signed.signature());
        assert_eq!(tampered.open().unwrap_err(), SignatureError::BadSignature);

        // Signed by someone else but claiming k's identity.
        let other = Keypair::deterministic(1, 1);
        let forged = Signed::<Note>::from_parts(signed.body().to_vec(), other.sign(Note::DOMAIN, signed.body()));
        assert_eq!(forged.open().unwrap_err(), SignatureError::BadSignature);
    }

    #[test]
    fn domains_separate_signatures() {
        let k = Keypair::deterministic(2, 0);
        let sig = k.sign(b"ragtag/v1/a", b"msg");
        assert!(verify(&k.node_id(), b"ragtag/v1/a", b"msg", &sig).is_ok());
        assert!(verify(&k.node_id(), b"ragtag/v1/b", b"msg", &sig).is_err());
    }

    #[test]
    fn batch_verifies_and_fails_on_one_bad() {
        let keys: Vec<Keypair> = (0..8).map(|i| Keypair::deterministic(3, i)).collect();
        let msgs: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 10]).collect();
        let mut items: Vec<SignatureCheck<'_>> = keys
            .iter()
            .zip(&msgs)
            .map(|(k, m)| SignatureCheck {
                signer: k.node_id(),
                domain: b"ragtag/v1/x",
                message: m,
                signature: k.sign(b"ragtag/v1/x", m),
            })
            .collect();
        assert!(verify_batch(&items).is_ok());
        items[5].signature[0] ^= 1;
        assert!(verify_batch(&items).is_err());
    }
}
