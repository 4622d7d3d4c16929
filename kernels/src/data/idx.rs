//! MNIST-style IDX files (images `idx3-ubyte` + labels `idx1-ubyte`, gzipped or not) to a dense
//! multiclass dataset; pixels are scaled to [0, 1].

use std::path::Path;

use super::error::{DataError, Result};
use super::format::{Kind, Shape, Truth, Writer};
use super::libsvm::Converted;
use super::text::read_all;

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Converts `images` + `labels` to a dataset at `output`.
pub fn convert(images: &Path, labels: &Path, output: &Path) -> Result<Converted> {
    let img = read_all(images)?;
    let lab = read_all(labels)?;
    if img.len() < 16 {
        return Err(DataError::format(
            images,
            format!("truncated: {} bytes, an IDX image header is 16", img.len()),
        ));
    }
    if be32(&img, 0) != IMAGES_MAGIC {
        return Err(DataError::format(
            images,
            format!(
                "wrong IDX magic {:#010x}, expected {IMAGES_MAGIC:#010x} (unsigned bytes, 3 dimensions)",
                be32(&img, 0)
            ),
        ));
    }
    if lab.len() < 8 {
        return Err(DataError::format(
            labels,
            format!("truncated: {} bytes, an IDX label header is 8", lab.len()),
        ));
    }
    if be32(&lab, 0) != LABELS_MAGIC {
        return Err(DataError::format(
            labels,
            format!(
                "wrong IDX magic {:#010x}, expected {LABELS_MAGIC:#010x} (unsigned bytes, 1 dimension)",
                be32(&lab, 0)
            ),
        ));
    }
    let (n, rows, cols) = (be32(&img, 4) as usize, be32(&img, 8) as usize, be32(&img, 12) as usize);
    let pixels = rows.checked_mul(cols);
    let need = pixels.and_then(|p| n.checked_mul(p)).and_then(|b| b.checked_add(16));
    if need != Some(img.len()) {
        let need = need.map_or_else(|| "more bytes than an address holds".to_owned(), |b| b.to_string());
        return Err(DataError::format(
            images,
            format!("{} bytes, the header ({n} images of {rows}x{cols}) needs {need}", img.len()),
        ));
    }
    let pixels = pixels.unwrap_or(0);
    let nl = be32(&lab, 4) as usize;
    if lab.len() != 8 + nl {
        return Err(DataError::format(
            labels,
            format!("{} bytes, the header ({nl} labels) needs {}", lab.len(), 8 + nl),
        ));
    }
    if nl != n {
        return Err(DataError::Invalid(format!(
            "{} holds {n} images but {} holds {nl} labels",
            images.display(),
            labels.display()
        )));
    }
    if n == 0 || pixels == 0 {
        return Err(DataError::format(images, "no images"));
    }
    let ys: Vec<u32> = lab[8..].iter().map(|&b| u32::from(b)).collect();
    let classes = ys.iter().max().map_or(0, |&m| m + 1);
    let shape = Shape {
        kind: Kind::Dense,
        rows: n as u64,
        cols: pixels as u64,
        nnz: 0,
        classes,
        users: 0,
        truth: Truth::None,
        scaled: false,
    };
    let mut w = Writer::create(output, shape)?;
    let mut row = vec![0f32; pixels];
    for image in img[16..].chunks_exact(pixels) {
        for (x, &p) in row.iter_mut().zip(image) {
            *x = f32::from(p) / 255.0;
        }
        w.write(0, &row)?;
    }
    w.write(1, &ys)?;
    w.finish()?;
    Ok(Converted { rows: n as u64, cols: pixels as u64, nnz: (n * pixels) as u64, input_bytes: 0 })
}
