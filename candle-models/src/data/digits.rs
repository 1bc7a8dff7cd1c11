//! The digits CSV format: 64 pixel values 0..16, then the label 0..9, one
//! example per line, no header.

use std::path::Path;

use ragtag_protocol::ids::Hash32;

use super::Examples;
use crate::{Error, Result};

const PIXELS: usize = 64;

/// Reads a digits CSV file; pixels are scaled to 0..1.
pub(crate) fn load(path: &Path) -> Result<(Examples, Hash32)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.into(), source })?;
    Ok((parse(path, &bytes)?, Hash32::of(&bytes)))
}

pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Examples> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Malformed {
        path: path.into(),
        at: format!("byte {}", e.valid_up_to()),
        message: "not valid UTF-8".into(),
    })?;
    let mut features = Vec::new();
    let mut labels = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |message: String| Error::Malformed { path: path.into(), at: format!("line {}", i + 1), message };
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != PIXELS + 1 {
            return Err(bad(format!("{} fields, expected {} (64 pixels and a label)", fields.len(), PIXELS + 1)));
        }
        for (j, f) in fields[..PIXELS].iter().enumerate() {
            let v: f32 = f.trim().parse().map_err(|_| bad(format!("pixel {} is not a number: {f:?}", j + 1)))?;
            if !(0.0..=16.0).contains(&v) {
                return Err(bad(format!("pixel {} = {v} outside 0..16", j + 1)));
            }
            features.push(v / 16.0);
        }
        let label: u32 =
            fields[PIXELS].trim().parse().map_err(|_| bad(format!("label {:?} is not an integer", fields[PIXELS])))?;
        if label > 9 {
            return Err(bad(format!("label {label} outside 0..9")));
        }
        labels.push(label);
    }
    if labels.is_empty() {
        return Err(Error::Empty { path: path.into(), message: "no examples".into() });
    }
    Ok(Examples { features, labels, width: PIXELS })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: u32) -> String {
        let mut f: Vec<String> = (0..64).map(|i| (i % 17).to_string()).collect();
        f.push(label.to_string());
        f.join(",")
    }

    #[test]
    fn parses_rows_and_names_bad_lines() {
        let p = Path::new("d.csv");
        let good = format!("{}\n{}\n", row(3), row(9));
        let ex = parse(p, good.as_bytes()).unwrap();
        assert_eq!(ex.labels, vec![3, 9]);
        assert_eq!(ex.features.len(), 128);
        assert_eq!(ex.features[16], 1.0);

        let bad = format!("{}\n1,2,3\n", row(1));
        let e = parse(p, bad.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("fields"), "{e}");
        let bad_label = row(12);
        assert!(parse(p, bad_label.as_bytes()).unwrap_err().to_string().contains("label 12"));
        assert!(matches!(parse(p, b"\n\n"), Err(Error::Empty { .. })));
        assert!(matches!(load(Path::new("/nonexistent/digits.csv")), Err(Error::Io { .. })));
    }
}
