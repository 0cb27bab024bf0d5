//! Reading and writing the safetensors files of the `infer` stage (`image0..N`, `img_mask0..N`,
//! `lang_tokens`, `lang_masks`, `state`, `noise` in; `actions` out). Every error names the file,
//! the tensor and what was expected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::Dtype;

use super::checkpoint::{parse_safetensors, regular_file, CheckpointError};
use super::model::TokenError;

/// An inputs or outputs file of the `infer` stage that cannot be used; each names the file (and
/// the tensor). All are the user's input except `Write`.
#[derive(Debug, thiserror::Error)]
pub enum TensorFileError {
    #[error("{path}: {message}")]
    Tensor { path: PathBuf, message: String },
    /// Not readable, not a regular file, or not a valid safetensors file.
    #[error(transparent)]
    File(CheckpointError),
    #[error("{path}: tensor `lang_tokens`, batch element {batch}")]
    Tokens {
        path: PathBuf,
        batch: usize,
        #[source]
        source: TokenError,
    },
    #[error("{path}")]
    Rtc {
        path: PathBuf,
        #[source]
        source: super::infer::RtcBatchError,
    },
    #[error("{path}: cannot write it")]
    Write {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
}

impl TensorFileError {
    /// The file's fault (exit 1), not the machine's: everything but a failed write.
    pub(crate) fn is_input_error(&self) -> bool {
        !matches!(self, TensorFileError::Write { .. })
    }
}

/// A tensor read from a file, with its values widened to the kind the model needs.
#[derive(Clone, Debug)]
pub(crate) enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

#[derive(Clone, Debug)]
pub struct NamedTensor {
    pub shape: Vec<usize>,
    pub(crate) values: Values,
}

pub struct TensorFile {
    pub(crate) path: PathBuf,
    pub tensors: HashMap<String, NamedTensor>,
}

impl TensorFile {
    pub fn read(path: &Path) -> Result<TensorFile, TensorFileError> {
        let err = |m: String| TensorFileError::Tensor {
            path: path.into(),
            message: m,
        };
        regular_file(path, "a safetensors file").map_err(TensorFileError::File)?;
        let bytes = crate::files::read_regular_bytes(path).map_err(|source| {
            TensorFileError::File(CheckpointError::Io {
                path: path.into(),
                source,
            })
        })?;
        let st = parse_safetensors(path, &bytes).map_err(TensorFileError::File)?;
        let mut tensors = HashMap::new();
        for (name, view) in st.iter() {
            let d = view.data();
            let values = match view.dtype() {
                Dtype::F32 => Values::F32(
                    d.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                Dtype::I64 => Values::I64(
                    d.chunks_exact(8)
                        .map(|b| {
                            i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
                        })
                        .collect(),
                ),
                Dtype::I32 => Values::I64(
                    d.chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                        .collect(),
                ),
                Dtype::U8 | Dtype::BOOL => Values::U8(d.to_vec()),
                other => {
                    return Err(err(format!(
                        "tensor `{name}` has unsupported dtype {other:?}"
                    )))
                }
            };
            tensors.insert(
                name.to_string(),
                NamedTensor {
                    shape: view.shape().to_vec(),
                    values,
                },
            );
        }
        Ok(TensorFile {
            path: path.into(),
            tensors,
        })
    }

    fn err(&self, message: String) -> TensorFileError {
        TensorFileError::Tensor {
            path: self.path.clone(),
            message,
        }
    }

    fn get(&self, name: &str) -> Result<&NamedTensor, TensorFileError> {
        self.tensors
            .get(name)
            .ok_or_else(|| self.err(format!("missing tensor `{name}`")))
    }

    fn check_shape(
        &self,
        name: &str,
        t: &NamedTensor,
        shape: &[Option<usize>],
    ) -> Result<(), TensorFileError> {
        let ok = t.shape.len() == shape.len()
            && t.shape
                .iter()
                .zip(shape)
                .all(|(a, b)| b.is_none_or(|b| *a == b));
        if ok {
            Ok(())
        } else {
            let want: Vec<String> = shape
                .iter()
                .map(|d| d.map_or("_".into(), |d| d.to_string()))
                .collect();
            Err(self.err(format!(
                "tensor `{name}` has shape {:?}, expected [{}]",
                t.shape,
                want.join(", ")
            )))
        }
    }

    /// An f32 tensor of the given shape (`None` = any size); values must be finite.
    pub fn f32(
        &self,
        name: &str,
        shape: &[Option<usize>],
    ) -> Result<(Vec<usize>, &[f32]), TensorFileError> {
        let t = self.get(name)?;
        self.check_shape(name, t, shape)?;
        match &t.values {
            Values::F32(v) => {
                if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                    return Err(self.err(format!(
                        "tensor `{name}` has a non-finite value at index {i}"
                    )));
                }
                Ok((t.shape.clone(), v))
            }
            _ => Err(self.err(format!("tensor `{name}` must be F32"))),
        }
    }

    pub fn i64(
        &self,
        name: &str,
        shape: &[Option<usize>],
    ) -> Result<(Vec<usize>, &[i64]), TensorFileError> {
        let t = self.get(name)?;
        self.check_shape(name, t, shape)?;
        match &t.values {
            Values::I64(v) => Ok((t.shape.clone(), v)),
            _ => Err(self.err(format!("tensor `{name}` must be I64 (or I32)"))),
        }
    }

    pub(crate) fn mask(
        &self,
        name: &str,
        shape: &[Option<usize>],
    ) -> Result<Vec<bool>, TensorFileError> {
        let t = self.get(name)?;
        self.check_shape(name, t, shape)?;
        match &t.values {
            Values::U8(v) => Ok(v.iter().map(|x| *x != 0).collect()),
            Values::I64(v) => Ok(v.iter().map(|x| *x != 0).collect()),
            Values::F32(_) => Err(self.err(format!("tensor `{name}` must be U8 or BOOL"))),
        }
    }
}

/// Writes f32 tensors to a safetensors file.
pub(crate) fn write_f32(
    path: &Path,
    tensors: &[(&str, Vec<usize>, &[f32])],
) -> Result<(), TensorFileError> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), b).map_err(
                |source| TensorFileError::Write {
                    path: path.into(),
                    source,
                },
            )?;
            Ok((name.to_string(), view))
        })
        .collect::<Result<_, TensorFileError>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|source| TensorFileError::Write {
        path: path.into(),
        source,
    })
}
