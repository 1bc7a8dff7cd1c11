//! Matrix products on the host for the custom operations (dense layers,
//! 3x3 convolutions): strided views checked against their storage, and one
//! gemm call into a buffer the operation owns, so a product can land where
//! the operation wants it (after bias rows, into a gradient) without a
//! tensor of its own.

use candle_core::{CpuStorage, Error, Layout};
use gemm::Parallelism;

/// A rank-2 f32 view: the storage from the view's first element, its rows,
/// columns and strides, checked to stay inside the storage. The fields are
/// private so that every view is made by a constructor that checks them:
/// [`product`] hands them to gemm unchecked.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    /// A rank-1 (one row) or rank-2 tensor as it lies in `s`.
    pub(crate) fn of(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> candle_core::Result<Self> {
        let all = f32_storage(s, op, what)?;
        let (rows, cols, row_stride, col_stride) = match (l.dims(), l.stride()) {
            ([r, c], [rs, cs]) => (*r, *c, *rs, *cs),
            ([c], [cs]) => (1, *c, 0, *cs),
            (dims, _) => return Err(Error::Msg(format!("{op}: {what} has rank {}", dims.len()))),
        };
        Self::checked(all.get(l.start_offset()..).unwrap_or_default(), rows, cols, row_stride, col_stride, op, what)
    }

    /// A contiguous tensor of any rank read as `rows x cols`.
    pub(crate) fn reshaped(
        s: &'a CpuStorage,
        l: &Layout,
        rows: usize,
        cols: usize,
        op: &str,
        what: &str,
    ) -> candle_core::Result<Self> {
        let (start, end) = l.contiguous_offsets().ok_or_else(|| Error::Msg(format!("{op}: non-contiguous {what}")))?;
        if Some(end - start) != rows.checked_mul(cols) {
            return Err(Error::Msg(format!("{op}: {what} of shape {:?} is not {rows} x {cols}", l.dims())));
        }
        let data = f32_storage(s, op, what)?.get(start..end).unwrap_or_default();
        Self::checked(data, rows, cols, cols, 1, op, what)
    }

    /// Contiguous rows of `cols` over `data`.
    pub(crate) fn rows_of(data: &'a [f32], cols: usize) -> Self {
        let rows = data.len().checked_div(cols).unwrap_or(0);
        Self { data, rows, cols, row_stride: cols, col_stride: 1 }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The elements of row `r` (the bias of a layer), or `None` past the
    /// last row.
    pub(crate) fn row(&self, r: usize) -> Option<Vec<f32>> {
        (r < self.rows).then(|| (0..self.cols).map(|c| self.data[r * self.row_stride + c * self.col_stride]).collect())
    }

    /// The transposed view of the same data.
    pub(crate) fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    fn checked(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
        op: &str,
        what: &str,
    ) -> candle_core::Result<Self> {
        let last = rows
            .saturating_sub(1)
            .checked_mul(row_stride)
            .and_then(|r| cols.saturating_sub(1).checked_mul(col_stride).and_then(|c| r.checked_add(c)));
        if rows > 0 && cols > 0 && last.is_none_or(|last| last >= data.len()) {
            return Err(Error::Msg(format!("{op}: {what} reaches past its storage")));
        }
        Ok(Self { data, rows, cols, row_stride, col_stride })
    }
}

fn f32_storage<'a>(s: &'a CpuStorage, op: &str, what: &str) -> candle_core::Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        _ => Err(Error::Msg(format!("{op}: {what} is not f32"))),
    }
}

/// `dst = a @ b`, or `dst += a @ b` when `accumulate`; `dst` holds the
/// product's rows contiguously. Runs on rayon's global pool with candle's
/// thread count, as candle's own matrix products do.
#[allow(unsafe_code)]
pub(crate) fn product(dst: &mut [f32], a: View<'_>, b: View<'_>, accumulate: bool) -> candle_core::Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || m.checked_mul(n) != Some(dst.len()) {
        return Err(Error::Msg(format!("product of [{m}, {k}] and [{}, {n}] into {} elements", b.rows, dst.len())));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return Ok(());
    }
    let threads = candle_core::utils::get_num_threads();
    let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: `View` checked that every element its strides reach lies in
    // its data, and `dst` holds `m * n` elements written row by row (row
    // stride `n`); `dst` is borrowed mutably, so it overlaps neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

/// `bias + a @ b` as contiguous rows: the bias (one row of `b.cols()`)
/// written into every row, then one product added to it, so a layer's
/// output needs no pass of its own for the bias.
pub(crate) fn biased_product(a: View<'_>, b: View<'_>, bias: View<'_>) -> candle_core::Result<Vec<f32>> {
    let row = match bias.row(0) {
        Some(row) if bias.rows == 1 && row.len() == b.cols => row,
        _ => return Err(Error::Msg(format!("bias [{}, {}] for {} outputs", bias.rows, bias.cols, b.cols))),
    };
    let mut y = Vec::with_capacity(a.rows.saturating_mul(b.cols));
    for _ in 0..a.rows {
        y.extend_from_slice(&row);
    }
    product(&mut y, a, b, true)?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: View<'_>, b: View<'_>) -> Vec<f32> {
        let mut out = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                out[i * b.cols + j] = (0..a.cols)
                    .map(|k| a.data[i * a.row_stride + k * a.col_stride] * b.data[k * b.row_stride + j * b.col_stride])
                    .sum();
            }
        }
        out
    }

    /// Plain, transposed and accumulated products agree with a loop.
    #[test]
    fn products_agree_with_a_loop() {
        let a: Vec<f32> = (0..35).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..28).map(|i| (i as f32 * 0.11).cos()).collect();
        let (a, b) = (View::rows_of(&a, 7), View::rows_of(&b, 4)); // [5, 7], [7, 4]
        let mut out = vec![0.0; 20];
        product(&mut out, a, b, false).unwrap();
        let want = naive(a, b);
        assert!(out.iter().zip(&want).all(|(o, w)| (o - w).abs() < 1e-5));
        product(&mut out, a, b, true).unwrap();
        assert!(out.iter().zip(&want).all(|(o, w)| (o - 2.0 * w).abs() < 1e-5));
        // a.t() @ a: [7, 5] @ [5, 7].
        let mut gram = vec![0.0; 49];
        product(&mut gram, a.t(), a, false).unwrap();
        let want = naive(a.t(), a);
        assert!(gram.iter().zip(&want).all(|(o, w)| (o - w).abs() < 1e-5));
    }

    /// Mismatched shapes and views past their data are errors.
    #[test]
    fn refuses_mismatches() {
        let a = [1.0f32; 6];
        let mut out = vec![0.0; 4];
        assert!(product(&mut out, View::rows_of(&a, 3), View::rows_of(&a, 3), false).is_err());
        assert!(product(&mut out[..3], View::rows_of(&a, 3), View::rows_of(&a, 2), false).is_err());
        assert!(View::checked(&a, 3, 3, 3, 1, "test", "a").is_err());
        let mut empty_k = vec![5.0; 4];
        let zero_k = View::checked(&[], 2, 0, 0, 1, "test", "a").unwrap();
        product(&mut empty_k, zero_k, zero_k.t(), false).unwrap();
        assert_eq!(empty_k, vec![0.0; 4]);
    }
}
