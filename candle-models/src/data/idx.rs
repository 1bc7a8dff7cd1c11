//! IDX files (the MNIST format): an images file (magic 0x00000803, u8
//! pixels) and a labels file (magic 0x00000801), named as `images,labels`.

use std::path::{Path, PathBuf};

use ragtag_protocol::ids::Hash32;

use super::Examples;
use crate::{Error, Result};

/// Largest number of examples we accept (bounds memory on hostile files).
const MAX_EXAMPLES: usize = 10_000_000;

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.into(), source })
}

/// Loads `images,labels` (a comma joins the two paths).
pub(crate) fn load_pair(spec: &Path) -> Result<(Examples, Hash32, Hash32)> {
    let s = spec.to_string_lossy();
    let (images, labels) = s.split_once(',').ok_or_else(|| Error::Malformed {
        path: spec.into(),
        at: "path".into(),
        message: "IDX data is given as IMAGES,LABELS".into(),
    })?;
    let (ip, lp) = (PathBuf::from(images), PathBuf::from(labels));
    let (ib, lb) = (read(&ip)?, read(&lp)?);
    Ok((parse(&ip, &ib, &lp, &lb)?, Hash32::of(&ib), Hash32::of(&lb)))
}

fn header(path: &Path, bytes: &[u8], magic: u32, dims: usize) -> Result<Vec<usize>> {
    let need = 4 + 4 * dims;
    if bytes.len() < need {
        return Err(Error::Malformed {
            path: path.into(),
            at: "byte 0".into(),
            message: format!("shorter than its {need}-byte header"),
        });
    }
    let m = u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"));
    if m != magic {
        return Err(Error::Malformed {
            path: path.into(),
            at: "byte 0".into(),
            message: format!("magic {m:#010x}, expected {magic:#010x}"),
        });
    }
    Ok((0..dims)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect())
}

pub(crate) fn parse(ip: &Path, images: &[u8], lp: &Path, labels: &[u8]) -> Result<Examples> {
    let d = header(ip, images, 0x0000_0803, 3)?;
    let (n, rows, cols) = (d[0], d[1], d[2]);
    let l = header(lp, labels, 0x0000_0801, 1)?;
    if n == 0 || n > MAX_EXAMPLES || rows == 0 || cols == 0 || rows > 4096 || cols > 4096 {
        return Err(Error::Empty { path: ip.into(), message: format!("unusable dimensions {n}x{rows}x{cols}") });
    }
    if l[0] != n {
        return Err(Error::Malformed {
            path: lp.into(),
            at: "byte 4".into(),
            message: format!("{} labels for {n} images", l[0]),
        });
    }
    let pixels = n * rows * cols;
    if images.len() != 16 + pixels {
        return Err(Error::Malformed {
            path: ip.into(),
            at: format!("byte {}", images.len()),
            message: format!("expected {} bytes", 16 + pixels),
        });
    }
    if labels.len() != 8 + n {
        return Err(Error::Malformed {
            path: lp.into(),
            at: format!("byte {}", labels.len()),
            message: format!("expected {} bytes", 8 + n),
        });
    }
    let features = images[16..].iter().map(|p| *p as f32 / 255.0).collect();
    let labels = labels[8..].iter().map(|l| *l as u32).collect();
    Ok(Examples { features, labels, width: rows * cols })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(n: u32) -> (Vec<u8>, Vec<u8>) {
        let mut im = 0x0803u32.to_be_bytes().to_vec();
        for d in [n, 4, 4] {
            im.extend(d.to_be_bytes());
        }
        im.extend((0..n * 16).map(|i| (i % 256) as u8));
        let mut lb = 0x0801u32.to_be_bytes().to_vec();
        lb.extend(n.to_be_bytes());
        lb.extend((0..n).map(|i| (i % 10) as u8));
        (im, lb)
    }

    #[test]
    fn parses_and_rejects_with_offsets() {
        let (im, lb) = files(3);
        let (p, q) = (Path::new("i"), Path::new("l"));
        let ex = parse(p, &im, q, &lb).unwrap();
        assert_eq!(ex.width, 16);
        assert_eq!(ex.labels, vec![0, 1, 2]);
        let e = parse(p, &im[..20], q, &lb).unwrap_err().to_string();
        assert!(e.contains("expected"), "{e}");
        let mut bad = im.clone();
        bad[3] = 0x01;
        assert!(parse(p, &bad, q, &lb).unwrap_err().to_string().contains("magic"));
        let (_, lb4) = files(4);
        assert!(parse(p, &im, q, &lb4).unwrap_err().to_string().contains("labels for"));
    }
}
