//! Loading a pi0 / pi0.5 checkpoint as lerobot (>= 0.4) and openpi's PyTorch export write it:
//! `config.json` + `model.safetensors` (or a sharded `model.safetensors.index.json`), or a bare
//! `model.safetensors`. Files are memory-mapped; each tensor is decoded (f32, bf16 or f16) once
//! into f32. Names are looked up with the aliases real exports use.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

pub use super::config_json::ArchOverrides;
pub(crate) use super::config_json::PolicyConfigJson;
use super::header::HeaderError;

/// Every way a checkpoint file can be wrong; each names the file (and the tensor, field or stat).
/// Causes are `#[source]`s, never repeated in the message (`{:#}` shows the whole chain).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{path}: cannot read it")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {kind}, expected {expected}")]
    NotAFile {
        path: PathBuf,
        kind: &'static str,
        expected: &'static str,
    },
    #[error("{path}: not valid JSON")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: field `{field}` is not valid")]
    Field {
        path: PathBuf,
        field: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: `{field}`: expected {expected}, found {found}")]
    Value {
        path: PathBuf,
        field: String,
        expected: String,
        found: String,
    },
    #[error("{path}: not a valid safetensors file")]
    Header {
        path: PathBuf,
        /// Boxed: its largest variant would double every `CheckpointError`'s size.
        #[source]
        source: Box<HeaderError>,
    },
    #[error("{path}: not a valid safetensors file")]
    Safetensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("{path}: tensor `{name}` not found (looked for {candidates})")]
    Missing {
        path: PathBuf,
        name: String,
        candidates: String,
    },
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor `{name}` has dtype {dtype}, expected {expected}")]
    Dtype {
        path: PathBuf,
        name: String,
        dtype: String,
        expected: &'static str,
    },
    #[error("{path}: tensor `{name}` holds a non-finite value at index {index}: refusing the checkpoint")]
    NonFinite {
        path: PathBuf,
        name: String,
        index: usize,
    },
    #[error("{path}: {message}")]
    Arch { path: PathBuf, message: String },
    #[error("{path}: quantized tensor `{name}`: {problem}")]
    Quantized {
        path: PathBuf,
        name: String,
        problem: String,
    },
    #[error("{path}: stat `{stat}` has {found} values, expected {expected} ({width})")]
    StatLength {
        path: PathBuf,
        stat: String,
        expected: usize,
        found: usize,
        /// Where the expected width comes from.
        width: String,
    },
    #[error("{path}: stat `{a}` has {a_len} values and `{b}` {b_len}: one normalization's stats must have equal lengths")]
    StatMismatch {
        path: PathBuf,
        a: String,
        a_len: usize,
        b: String,
        b_len: usize,
    },
}

/// What kind of thing a non-regular file is, for messages.
fn file_kind(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Refuses anything but a regular file at `path` (following symlinks) before it is opened: a
/// directory would fail later with an unrelated message, a FIFO would block.
pub(crate) fn regular_file(path: &Path, expected: &'static str) -> Result<u64, CheckpointError> {
    let meta = std::fs::metadata(path).map_err(|source| CheckpointError::Io {
        path: path.into(),
        source,
    })?;
    if !meta.is_file() {
        return Err(CheckpointError::NotAFile {
            path: path.into(),
            kind: file_kind(meta.file_type()),
            expected,
        });
    }
    Ok(meta.len())
}

/// A text file's contents, refused unless it is a regular file.
pub(crate) fn read_text(path: &Path, expected: &'static str) -> Result<String, CheckpointError> {
    regular_file(path, expected)?;
    std::fs::read_to_string(path).map_err(|source| CheckpointError::Io {
        path: path.into(),
        source,
    })
}

/// Checks `bytes` as a safetensors file and parses it (`path` for messages).
pub(crate) fn parse_safetensors<'a>(
    path: &Path,
    bytes: &'a [u8],
) -> Result<SafeTensors<'a>, CheckpointError> {
    super::header::check(bytes).map_err(|source| CheckpointError::Header {
        path: path.into(),
        source: Box::new(source),
    })?;
    SafeTensors::deserialize(bytes).map_err(|source| CheckpointError::Safetensors {
        path: path.into(),
        source,
    })
}

/// Storage type of a tensor in the checkpoint (compute is f32 either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightDtype {
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    /// The float type a safetensors dtype names, if it is one pi0d computes from.
    pub(crate) fn of(dtype: Dtype) -> Option<WeightDtype> {
        match dtype {
            Dtype::F32 => Some(WeightDtype::F32),
            Dtype::BF16 => Some(WeightDtype::Bf16),
            Dtype::F16 => Some(WeightDtype::F16),
            _ => None,
        }
    }

    /// Rounds `x` to this storage type and back, as PyTorch does when it computes in it.
    pub(crate) fn round(self, x: f32) -> f32 {
        match self {
            WeightDtype::F32 => x,
            WeightDtype::Bf16 => bf16::from_f32(x).to_f32(),
            WeightDtype::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// Bytes a value takes in the file.
    pub(crate) fn size(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 | WeightDtype::F16 => 2,
        }
    }
}

/// Bytes of a mapped table checked before its pages are handed back (`take_rows`).
const CHECK_WINDOW: usize = 8 << 20;

/// Hands `bytes` bytes of `map` from `offset` back to the kernel, so they stop counting as
/// resident memory once a copy replaced them (or a check read them). Nothing is lost: the map is
/// read-only, and a later read faults the pages in again from the file.
fn release_pages(map: &memmap2::Mmap, offset: usize, bytes: usize) {
    // SAFETY: MADV_DONTNEED on a read-only file mapping only drops clean page-cache references;
    // the contents seen through the map do not change.
    let _ =
        unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, bytes) };
}

/// f32 tensor data: a view into the memory-mapped checkpoint when it is stored as aligned
/// little-endian f32 (no copy in RAM), or decoded from bf16/f16.
#[derive(Clone)]
pub(crate) enum Weights {
    Owned(Vec<f32>),
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
}

impl std::ops::Deref for Weights {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Weights::Owned(v) => v,
            Weights::Mapped { map, offset, len } => {
                let bytes = &map[*offset..*offset + len * 4];
                // SAFETY: alignment and length were checked when the view was made; the map is
                // read-only and lives as long as this value; f32 has no invalid bit patterns.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const f32, *len) }
            }
        }
    }
}

impl Weights {
    /// Hands the checkpoint pages of a mapped tensor back once a copy (decoded or packed) has
    /// replaced them (`release_pages`).
    pub(crate) fn release(&self) {
        if let Weights::Mapped { map, offset, len } = self {
            release_pages(map, *offset, len * 4);
        }
    }
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if matches!(self, Weights::Owned(_)) {
            "owned"
        } else {
            "mapped"
        };
        write!(f, "Weights({kind}, {} values)", self.len())
    }
}

/// A tensor ready for compute: row-major f32 values and the type it was stored in (the shape
/// was checked against the model's when it was read).
#[derive(Clone, Debug)]
pub(crate) struct Tensor {
    pub(crate) data: Weights,
    pub(crate) dtype: WeightDtype,
}

/// Little-endian `dtype` values in `bytes`, as f32.
pub(crate) fn decode(bytes: &[u8], dtype: WeightDtype) -> impl Iterator<Item = f32> + '_ {
    bytes.chunks_exact(dtype.size()).map(move |b| match dtype {
        WeightDtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        WeightDtype::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        WeightDtype::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
    })
}

/// A row-major table in a mapped checkpoint file, decoded a row at a time
/// (`Checkpoint::take_rows`).
#[derive(Clone)]
pub(crate) struct MappedRows {
    map: Arc<memmap2::Mmap>,
    offset: usize,
    pub(crate) rows: usize,
    pub(crate) width: usize,
    /// The type the table is stored in.
    pub(crate) dtype: WeightDtype,
}

impl MappedRows {
    /// Row `i` as f32 into `out` (`width` values). Panics if `i >= rows`.
    pub(crate) fn row(&self, i: usize, out: &mut [f32]) {
        assert!(i < self.rows, "row {i} of a {}-row table", self.rows);
        let size = self.dtype.size();
        let start = self.offset + i * self.width * size;
        let bytes = &self.map[start..start + self.width * size];
        for (o, v) in out.iter_mut().zip(decode(bytes, self.dtype)) {
            *o = v;
        }
    }
}

impl std::fmt::Debug for MappedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedRows({}x{}, {:?})",
            self.rows, self.width, self.dtype
        )
    }
}

/// Where a tensor lies in a mapped file; decoded only when the model takes it.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    /// Its canonical name (without a leading `model.`).
    pub(crate) name: String,
    /// The name the file stores it under (what a rewritten checkpoint keeps).
    pub(crate) stored: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: Dtype,
    file: usize,
    offset: usize,
    pub(crate) bytes: usize,
}

pub struct Checkpoint {
    /// The directory (or file) it was loaded from, for messages.
    pub(crate) path: PathBuf,
    pub(crate) config: PolicyConfigJson,
    /// `arch.json` beside the weights, if any.
    pub(crate) arch_file: Option<ArchOverrides>,
    /// Its `quantization.json` asks for int8 activations (`w8a8`): the int8 weights are
    /// multiplied by activations quantized per token.
    pub(crate) int8_activations: bool,
    /// The linear weights (canonical names) its manifest says are stored rotated (`W R`):
    /// their inputs are rotated the same way before they are multiplied.
    pub(crate) rotated: HashSet<String>,
    /// Set while `pi0d quantize --calibration` runs the float model: its linear layers report
    /// their inputs here.
    pub(crate) calibration: Option<Arc<super::quant::calibrate::Recorder>>,
    maps: Vec<(PathBuf, Arc<memmap2::Mmap>)>,
    tensors: HashMap<String, Entry>,
}

/// Strips the prefixes exports differ in, so lookups are by one canonical name.
pub(crate) fn canonical(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

fn file_err(path: &Path, message: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::File {
        path: path.into(),
        message: message.to_string(),
    }
}

const SAFETENSORS: &str = "a safetensors file";

/// Maps one safetensors file and records where each tensor lies in it.
fn index_safetensors(
    path: &Path,
    maps: &mut Vec<(PathBuf, Arc<memmap2::Mmap>)>,
    into: &mut HashMap<String, Entry>,
) -> Result<(), CheckpointError> {
    regular_file(path, SAFETENSORS)?;
    let io = |source| CheckpointError::Io {
        path: path.into(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: mapped read-only; checkpoints are immutable inputs that are not modified while
    // pi0d runs (the usual contract of memory-mapped model files).
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?);
    let st = parse_safetensors(path, &map)?;
    let base = map.as_ptr() as usize;
    for (stored, view) in st.iter() {
        let name = canonical(stored).to_string();
        into.insert(
            name.clone(),
            Entry {
                name,
                stored: stored.to_string(),
                shape: view.shape().to_vec(),
                dtype: view.dtype(),
                file: maps.len(),
                offset: view.data().as_ptr() as usize - base,
                bytes: view.data().len(),
            },
        );
    }
    maps.push((path.to_path_buf(), map.clone()));
    Ok(())
}

/// The shard files `index` (`model.safetensors.index.json`) names, each a plain relative path
/// inside `dir`.
fn shards(dir: &Path, index: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let json = super::config_json::parse_object(index, &read_text(index, "a JSON file")?)?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| file_err(index, "expected a \"weight_map\" object"))?;
    let mut shards = Vec::new();
    for (tensor, shard) in map {
        let shard = shard.as_str().ok_or_else(|| {
            file_err(
                index,
                format!("weight_map: `{tensor}` names no shard file (expected a file name)"),
            )
        })?;
        let rel = Path::new(shard);
        if shard.is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(file_err(
                index,
                format!("weight_map: `{tensor}` names shard `{shard}`, which is not a file name inside {}", dir.display()),
            ));
        }
        shards.push(rel.to_path_buf());
    }
    shards.sort_unstable();
    shards.dedup();
    for shard in &shards {
        if !dir.join(shard).exists() {
            return Err(file_err(
                index,
                format!(
                    "names shard `{}`, which is not in {}",
                    shard.display(),
                    dir.display()
                ),
            ));
        }
    }
    Ok(shards)
}

/// An int4 weight (U8 with a `_scale` beside it, `quant`) is stored `[out, in / 2]`: its entry
/// takes the shape it has in the model, `[out, in]`, so that everything reading shapes (the
/// architecture, the loaders' checks) sees the model's. Its bytes stay what the file holds.
fn logical_int4_shapes(tensors: &mut HashMap<String, Entry>) {
    let int4: Vec<String> = tensors
        .values()
        .filter(|e| {
            e.dtype == Dtype::U8
                && e.shape.len() == 2
                && tensors.contains_key(&format!("{}_scale", e.name))
        })
        .map(|e| e.name.clone())
        .collect();
    for name in int4 {
        if let Some(e) = tensors.get_mut(&name) {
            e.shape[1] *= 2;
        }
    }
}

impl Checkpoint {
    /// Loads a checkpoint directory (`config.json` beside the weights) or a bare `.safetensors`
    /// file (lerobot's default config).
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let mut tensors = HashMap::new();
        let mut maps = Vec::new();
        let (dir, config) = if path.is_dir() {
            let cfg_path = path.join("config.json");
            if !cfg_path.exists() {
                // Defaults would give the padded 32 joints, and a misleading width error later.
                return Err(file_err(
                    path,
                    "no config.json (a lerobot checkpoint directory holds config.json beside model.safetensors)",
                ));
            }
            let text = read_text(&cfg_path, "a JSON file")?;
            let config = PolicyConfigJson::parse(&cfg_path, &text)?;
            let single = path.join("model.safetensors");
            let index = path.join("model.safetensors.index.json");
            if single.exists() {
                index_safetensors(&single, &mut maps, &mut tensors)?;
            } else if index.exists() {
                for shard in shards(path, &index)? {
                    index_safetensors(&path.join(shard), &mut maps, &mut tensors)?;
                }
            } else {
                return Err(file_err(
                    path,
                    "no model.safetensors or model.safetensors.index.json",
                ));
            }
            (path.to_path_buf(), config)
        } else {
            index_safetensors(path, &mut maps, &mut tensors)?;
            (
                path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                PolicyConfigJson::default(),
            )
        };
        logical_int4_shapes(&mut tensors);
        let arch_path = dir.join("arch.json");
        let arch_file = if arch_path.exists() {
            Some(ArchOverrides::load(&arch_path)?)
        } else {
            None
        };
        let quantized = dir.join(super::quant::MANIFEST);
        let (int8_activations, rotated) = if quantized.exists() {
            let text = read_text(&quantized, "a JSON file")?;
            let m: super::quant::Manifest = serde_json::from_str(&text).map_err(|e| {
                file_err(&quantized, format!("not a pi0d quantization manifest: {e}"))
            })?;
            m.check_against(tensors.values().map(|e| (e.name.as_str(), e.dtype)))
                .map_err(|why| {
                    file_err(
                        &quantized,
                        format!("does not describe the checkpoint's weights: {why}"),
                    )
                })?;
            let rotated = m.rotated.iter().map(|n| canonical(n).to_string()).collect();
            (m.scheme == super::quant::Scheme::W8a8, rotated)
        } else {
            (false, HashSet::new())
        };
        Ok(Checkpoint {
            path: path.to_path_buf(),
            config,
            arch_file,
            int8_activations,
            rotated,
            calibration: None,
            maps,
            tensors,
        })
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The first of `names` present (canonical names, without a leading `model.`); its entry
    /// carries the name it was found under.
    pub(crate) fn find(&self, names: &[&str]) -> Result<&Entry, CheckpointError> {
        names
            .iter()
            .find_map(|n| self.tensors.get(*n))
            .ok_or_else(|| CheckpointError::Missing {
                path: self.path.clone(),
                name: names.first().copied().unwrap_or_default().to_string(),
                candidates: names.join(", "),
            })
    }

    /// The file an entry lies in.
    pub(crate) fn file_of(&self, e: &Entry) -> &Path {
        &self.maps[e.file].0
    }

    /// The entry of the first of `names` found, checked to have `shape` and a float type.
    /// Errors name the tensor found (an alias, maybe), not the first name asked for.
    fn checked(
        &self,
        names: &[&str],
        shape: &[usize],
    ) -> Result<(&Entry, WeightDtype, &PathBuf, &Arc<memmap2::Mmap>), CheckpointError> {
        let e = self.find(names)?;
        let (file, map) = &self.maps[e.file];
        if e.shape != shape {
            return Err(CheckpointError::Shape {
                path: file.clone(),
                name: e.name.clone(),
                expected: shape.to_vec(),
                found: e.shape.clone(),
            });
        }
        let dtype = WeightDtype::of(e.dtype).ok_or_else(|| CheckpointError::Dtype {
            path: file.clone(),
            name: e.name.clone(),
            dtype: format!("{:?}", e.dtype),
            expected: "F32, BF16 or F16",
        })?;
        Ok((e, dtype, file, map))
    }

    /// A tensor that must have `shape`, checked to hold only finite values. Aligned f32 data is
    /// a view into the map; bf16 and f16 are decoded to f32.
    pub(crate) fn take(&self, names: &[&str], shape: &[usize]) -> Result<Tensor, CheckpointError> {
        let (e, dtype, file, map) = self.checked(names, shape)?;
        let bytes = &map[e.offset..e.offset + e.bytes];
        let data = if dtype == WeightDtype::F32
            && cfg!(target_endian = "little")
            && (bytes.as_ptr() as usize).is_multiple_of(4)
        {
            Weights::Mapped {
                map: map.clone(),
                offset: e.offset,
                len: e.bytes / 4,
            }
        } else {
            let owned = decode(bytes, dtype).collect();
            // The decoded copy replaces the file's pages (a bf16 checkpoint would otherwise
            // hold both in memory).
            release_pages(map, e.offset, e.bytes);
            Weights::Owned(owned)
        };
        if let Some(index) = data.iter().position(|x| !x.is_finite()) {
            return Err(CheckpointError::NonFinite {
                path: file.clone(),
                name: e.name.clone(),
                index,
            });
        }
        Ok(Tensor { data, dtype })
    }

    /// A `[rows, width]` table read a row at a time straight from the map, never decoded whole
    /// (the text embedding: 257152 rows, of which a prompt reads a few dozen). Checked like
    /// `take`; the pages the check read are handed back afterwards.
    pub(crate) fn take_rows(
        &self,
        names: &[&str],
        rows: usize,
        width: usize,
    ) -> Result<MappedRows, CheckpointError> {
        self.take_rows_in(names, rows, width, CHECK_WINDOW)
    }

    fn take_rows_in(
        &self,
        names: &[&str],
        rows: usize,
        width: usize,
        window: usize,
    ) -> Result<MappedRows, CheckpointError> {
        let (e, dtype, file, map) = self.checked(names, &[rows, width])?;
        // Checked a window at a time, each window's pages handed back before the next is read:
        // the table (2.1 GB for a full-size pi0 in f32) never counts as resident all at once.
        let window = (window - window % dtype.size()).max(dtype.size());
        let mut at = 0;
        while at < e.bytes {
            let len = window.min(e.bytes - at);
            let bytes = &map[e.offset + at..e.offset + at + len];
            if let Some(i) = decode(bytes, dtype).position(|x| !x.is_finite()) {
                return Err(CheckpointError::NonFinite {
                    path: file.clone(),
                    name: e.name.clone(),
                    index: at / dtype.size() + i,
                });
            }
            release_pages(map, e.offset + at, len);
            at += len;
        }
        Ok(MappedRows {
            map: map.clone(),
            offset: e.offset,
            rows,
            width,
            dtype,
        })
    }

    /// Every tensor, in no particular order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.tensors.values()
    }

    /// The canonical name's entry, if present.
    pub(crate) fn entry(&self, name: &str) -> Option<&Entry> {
        self.tensors.get(name)
    }

    /// An entry's bytes as the file stores them.
    pub(crate) fn bytes(&self, e: &Entry) -> &[u8] {
        &self.maps[e.file].1[e.offset..e.offset + e.bytes]
    }

    /// Hands an entry's pages back once a copy replaced them (`release_pages`).
    pub(crate) fn release(&self, e: &Entry) {
        release_pages(&self.maps[e.file].1, e.offset, e.bytes);
    }

    /// The mapped weight files and their bytes (for hashing a checkpoint).
    pub(crate) fn files(&self) -> impl Iterator<Item = (&Path, &[u8])> {
        self.maps.iter().map(|(p, m)| (p.as_path(), &m[..]))
    }

    /// Number of `prefix.N.` layers present.
    pub(crate) fn count_layers(&self, prefix: &str) -> usize {
        (0..)
            .take_while(|i| {
                let p = format!("{prefix}.{i}.");
                self.tensors.keys().any(|k| k.starts_with(&p))
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bare safetensors file holding one f32 `[rows, width]` table.
    fn table(name: &str, rows: usize, width: usize, values: &[f32]) -> crate::testing::TempDir {
        let dir = crate::testing::TempDir::new(name);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(
            safetensors::Dtype::F32,
            vec![rows, width],
            &bytes,
        )
        .unwrap();
        safetensors::serialize_to_file([("embed", view)], None, &dir.join("t.safetensors"))
            .unwrap();
        dir
    }

    #[test]
    fn when_a_table_is_checked_in_windows_expect_a_non_finite_value_found_at_its_own_index() {
        let (rows, width) = (1000, 16);
        let mut values: Vec<f32> = (0..rows * width).map(|i| i as f32 * 0.5).collect();
        let dir = table("rows-window-ok", rows, width, &values);
        let ck = Checkpoint::load(&dir.join("t.safetensors")).unwrap();
        // Windows of 4 KiB (1024 values), one of 6 bytes (rounded down to one value).
        for window in [4096, 6] {
            let t = ck.take_rows_in(&["embed"], rows, width, window).unwrap();
            let mut row = vec![0.0; width];
            t.row(562, &mut row);
            assert_eq!(row[3], (562 * width + 3) as f32 * 0.5);
        }
        // A NaN in the ninth window: its index in the whole table.
        values[9000] = f32::NAN;
        let dir = table("rows-window-nan", rows, width, &values);
        let ck = Checkpoint::load(&dir.join("t.safetensors")).unwrap();
        for window in [4096, 6, CHECK_WINDOW] {
            match ck.take_rows_in(&["embed"], rows, width, window) {
                Err(CheckpointError::NonFinite { index, name, .. }) => {
                    assert_eq!((index, name.as_str()), (9000, "embed"), "window {window}")
                }
                other => panic!("window {window}: {other:?}"),
            }
        }
    }
}
