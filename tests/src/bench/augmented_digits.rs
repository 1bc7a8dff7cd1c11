//! An image task for the CNN: many handwritten digits, written in the
//! digits CSV format so that the node's own file loader reads them. Each
//! row is one of the 1,797 real digits (`candle-models/testdata/digits.csv`)
//! turned by a random rotation, scale and shift and given pixel noise. The
//! loader holds out every fifth row, and those rows are drawn only from
//! every fifth real digit, which no training row is drawn from: the
//! held-out loss measures digits written by hands the model never saw, and
//! a model needs many samples to learn the invariances.

use std::{fmt::Write as _, io::Write as _, path::Path};

use ragtag_protocol::rng::SeededRng;

/// Image side of the digits format.
const SIDE: usize = 8;
/// Largest rotation either way, radians (15 degrees).
const MAX_ROTATION: f64 = 0.26;
/// Scales are drawn from 1 ± this.
const MAX_SCALE: f64 = 0.15;
/// Largest shift either way, pixels.
const MAX_SHIFT: f64 = 1.0;
/// Standard deviation of the pixel noise, on the 0..16 scale.
const NOISE: f64 = 1.5;

/// Why the task could not be written.
#[derive(Debug, thiserror::Error)]
pub enum AugmentError {
    /// A file could not be read or written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The source file is not in the digits format.
    #[error("{path}: line {line}: {why}")]
    Source {
        /// The source file.
        path: String,
        /// Its line.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
}

/// A real digit: pixels on the 0..16 scale, row-major, and its label.
type Digit = ([f64; SIDE * SIDE], u8);

fn read_source(path: &Path) -> Result<Vec<Digit>, AugmentError> {
    let text = std::fs::read_to_string(path)?;
    let bad = |line: usize, why: &str| AugmentError::Source { path: path.display().to_string(), line, why: why.into() };
    let mut digits = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let values: Vec<f64> = line
            .split(',')
            .map(|v| v.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|_| bad(i + 1, "not numbers"))?;
        if values.len() != SIDE * SIDE + 1 {
            return Err(bad(i + 1, "expected 64 pixels and a label"));
        }
        let mut pixels = [0.0; SIDE * SIDE];
        pixels.copy_from_slice(&values[..SIDE * SIDE]);
        digits.push((pixels, values[SIDE * SIDE] as u8));
    }
    if digits.len() < 5 {
        return Err(bad(0, "fewer than five digits"));
    }
    Ok(digits)
}

/// The source pixel at (x, y), 0 outside the image.
fn pixel(img: &[f64; SIDE * SIDE], x: i64, y: i64) -> f64 {
    if (0..SIDE as i64).contains(&x) && (0..SIDE as i64).contains(&y) {
        img[y as usize * SIDE + x as usize]
    } else {
        0.0
    }
}

/// `img` rotated, scaled and shifted about its centre (bilinear), with noise.
fn transform(img: &[f64; SIDE * SIDE], rng: &mut SeededRng) -> [u32; SIDE * SIDE] {
    let angle = rng.uniform_range(-MAX_ROTATION, MAX_ROTATION);
    let scale = 1.0 + rng.uniform_range(-MAX_SCALE, MAX_SCALE);
    let (dx, dy) = (rng.uniform_range(-MAX_SHIFT, MAX_SHIFT), rng.uniform_range(-MAX_SHIFT, MAX_SHIFT));
    let (sin, cos) = angle.sin_cos();
    let centre = (SIDE as f64 - 1.0) / 2.0;
    let mut out = [0u32; SIDE * SIDE];
    for (i, o) in out.iter_mut().enumerate() {
        // The output pixel, mapped back into the source image.
        let (u, v) = ((i % SIDE) as f64 - centre - dx, (i / SIDE) as f64 - centre - dy);
        let sx = (cos * u + sin * v) / scale + centre;
        let sy = (-sin * u + cos * v) / scale + centre;
        let (x0, y0) = (sx.floor(), sy.floor());
        let (fx, fy) = (sx - x0, sy - y0);
        let (x0, y0) = (x0 as i64, y0 as i64);
        let value = pixel(img, x0, y0) * (1.0 - fx) * (1.0 - fy)
            + pixel(img, x0 + 1, y0) * fx * (1.0 - fy)
            + pixel(img, x0, y0 + 1) * (1.0 - fx) * fy
            + pixel(img, x0 + 1, y0 + 1) * fx * fy;
        *o = (value + NOISE * rng.normal()).round().clamp(0.0, 16.0) as u32;
    }
    out
}

/// Writes `rows` transformed digits of `source` to `path`, the same bytes
/// for the same seed. Row `r` with `r % 5 == 0` comes from a real digit
/// whose index is a multiple of five, every other row from the rest.
pub fn write(source: &Path, path: &Path, rows: usize, seed: u64) -> Result<(), AugmentError> {
    let digits = read_source(source)?;
    let (held, train): (Vec<usize>, Vec<usize>) = (0..digits.len()).partition(|i| i % 5 == 0);
    let mut rng = SeededRng::derive(seed, "augmented-digits");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut line = String::new();
    for row in 0..rows {
        let pool = if row % 5 == 0 { &held } else { &train };
        let (img, label) = &digits[pool[rng.below(pool.len() as u64) as usize]];
        line.clear();
        for px in transform(img, &mut rng) {
            let _ = write!(line, "{px},");
        }
        let _ = writeln!(line, "{label}");
        out.write_all(line.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../candle-models/testdata/digits.csv")
    }

    #[test]
    fn same_seed_same_bytes_in_the_digits_format() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
        write(&source(), &a, 400, 3).unwrap();
        write(&source(), &b, 400, 3).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let text = std::fs::read_to_string(&a).unwrap();
        assert_eq!(text.lines().count(), 400);
        for l in text.lines() {
            let v: Vec<u32> = l.split(',').map(|x| x.parse().unwrap()).collect();
            assert_eq!(v.len(), 65);
            assert!(v[..64].iter().all(|p| *p <= 16) && v[64] <= 9, "{l}");
        }
    }

    #[test]
    fn held_out_rows_come_only_from_held_out_digits() {
        // With no transform or noise a row would equal its source; instead
        // check the label statistics of a pool that has a single digit.
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.csv");
        // Digit 0 (held out) is all-7 labelled 7; the four others are 0s labelled 1.
        let mut text = format!("{}7\n", "16,".repeat(64));
        text.push_str(&format!("{}1\n", "0,".repeat(64)).repeat(4));
        std::fs::write(&src, text).unwrap();
        let out = dir.path().join("out.csv");
        write(&src, &out, 50, 1).unwrap();
        for (r, l) in std::fs::read_to_string(&out).unwrap().lines().enumerate() {
            let label = l.rsplit(',').next().unwrap();
            assert_eq!(label, if r % 5 == 0 { "7" } else { "1" }, "row {r}");
        }
    }

    #[test]
    fn a_transformed_digit_keeps_most_of_its_ink_near_the_original() {
        let digits = read_source(&source()).unwrap();
        let mut rng = SeededRng::new(5);
        let (img, _) = &digits[0];
        let out = transform(img, &mut rng);
        let ink = |v: &mut dyn Iterator<Item = f64>| v.sum::<f64>();
        let (a, b) = (ink(&mut img.iter().copied()), ink(&mut out.iter().map(|p| *p as f64)));
        assert!((b - a).abs() < 0.5 * a, "ink {a} became {b}");
        let differs = img.iter().zip(out.iter()).filter(|(x, y)| (**x - **y as f64).abs() > 2.0).count();
        assert!(differs > 0, "the transform changed nothing");
    }
}
