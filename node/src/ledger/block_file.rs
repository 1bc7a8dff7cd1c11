//! The sealed blocks of a [`BlockLog`](super::block_log::BlockLog): an
//! append-only file of length-prefixed blocks.
//!
//! The file holds no length of its own: sled holds how many of its bytes are
//! committed, in the same batch that frees the tail's keys. Bytes past that
//! length are left by a crash between writing a block here and committing it
//! in sled; they are never read, and the next write cuts them off.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::FileExt,
    path::Path,
};

/// Bytes of a frame's length prefix.
const PREFIX: usize = 4;

/// One sealed-block file.
#[derive(Debug)]
pub(crate) struct BlockFile {
    file: File,
}

/// Where a frame's length prefix points past the committed bytes.
#[derive(Debug, thiserror::Error)]
#[error("a block at byte {at} claims {len} bytes, past the committed {committed}")]
pub struct FrameError {
    /// Where the frame starts.
    pub at: u64,
    /// The length it claims.
    pub len: u64,
    /// The committed length.
    pub committed: u64,
}

impl BlockFile {
    /// Opens (or creates) the file at `path`.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        Ok(Self { file })
    }

    /// Writes `bytes` (frames made with [`frame`]) at `at`, the committed
    /// length, cutting off anything after it first, and syncs them to disk:
    /// sled may persist the new length before our next flush.
    pub(crate) fn write_at(&self, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.set_len(at)?;
        self.file.write_all_at(bytes, at)?;
        self.file.sync_data()
    }

    /// The bytes in `from..to`; an error, before any allocation, where the
    /// file is shorter than `to` (a length in sled that the file never got).
    pub(crate) fn read(&self, from: u64, to: u64) -> io::Result<Vec<u8>> {
        let have = self.file.metadata()?.len();
        if to > have {
            let msg = format!("{to} bytes committed, {have} in the file");
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, msg));
        }
        let mut buf = vec![0; to.saturating_sub(from) as usize];
        self.file.read_exact_at(&mut buf, from)?;
        Ok(buf)
    }
}

/// Appends `body` to `out` as one frame.
pub(crate) fn frame(out: &mut Vec<u8>, body: &[u8]) {
    let len = u32::try_from(body.len()).expect("a sealed block is far under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
}

/// The frames in `bytes` (read from offset `base`), each with its offset; a
/// length prefix is checked against the bytes left before anything is read.
pub(crate) fn frames(bytes: &[u8], base: u64) -> Result<Vec<(u64, &[u8])>, FrameError> {
    let committed = base + bytes.len() as u64;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let at = base + pos as u64;
        let rest = &bytes[pos..];
        let len = match rest.get(..PREFIX) {
            Some(p) => u32::from_le_bytes(p.try_into().expect("4 bytes")) as usize,
            None => return Err(FrameError { at, len: rest.len() as u64, committed }),
        };
        let body = rest.get(PREFIX..PREFIX + len).ok_or(FrameError { at, len: len as u64, committed })?;
        out.push((at, body));
        pos += PREFIX + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn frames_read_back_and_leftovers_are_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let f = BlockFile::open(&dir.path().join("b")).unwrap();
        let mut bytes = Vec::new();
        frame(&mut bytes, b"one");
        frame(&mut bytes, b"");
        frame(&mut bytes, b"three");
        f.write_at(0, &bytes).unwrap();
        // A write never committed, then one at the committed length.
        f.write_at(bytes.len() as u64, &[9; 100]).unwrap();
        let mut more = Vec::new();
        frame(&mut more, b"four");
        f.write_at(bytes.len() as u64, &more).unwrap();
        bytes.extend(&more);
        let read = f.read(0, bytes.len() as u64).unwrap();
        assert_eq!(read, bytes);
        assert_eq!(std::fs::metadata(dir.path().join("b")).unwrap().len(), bytes.len() as u64);
        let bodies: Vec<&[u8]> = frames(&read, 0).unwrap().into_iter().map(|(_, b)| b).collect();
        assert_eq!(bodies, [&b"one"[..], b"", b"three", b"four"]);
        let offsets: Vec<u64> = frames(&read, 0).unwrap().into_iter().map(|(a, _)| a).collect();
        assert_eq!(offsets, [0, 7, 11, 20]);
    }

    #[test]
    fn a_length_past_the_end_is_an_error() {
        let mut bytes = Vec::new();
        frame(&mut bytes, b"abc");
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = frames(&bytes, 10).unwrap_err();
        assert_eq!((err.at, err.len, err.committed), (17, u32::MAX as u64, 21));
        assert!(frames(&bytes[..9], 0).is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(fs) = frames(&bytes, 0) {
                let total: usize = fs.iter().map(|(_, b)| PREFIX + b.len()).sum();
                prop_assert_eq!(total, bytes.len());
            }
        }
    }
}
