//! `manifest.json`: what `pi0d export` wrote and everything a runtime needs to drive the graphs
//! (no checkpoint needed at run time).

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::export::pi0::ExportDtype;

pub(crate) const FORMAT: &str = "pi0d-graphs/1";
pub(crate) const FILE: &str = "manifest.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IoSpec {
    pub(crate) name: String,
    /// ONNX's type name: float32, float16, bfloat16, int64.
    pub(crate) dtype: String,
    pub(crate) shape: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphEntry {
    /// The ONNX file, relative to the manifest.
    pub file: String,
    /// Its external weight file, when the weights do not fit the 2 GB protobuf limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_data: Option<String>,
    pub(crate) inputs: Vec<IoSpec>,
    pub(crate) outputs: Vec<IoSpec>,
    /// Bytes of weights in the graph.
    pub weight_bytes: u64,
    /// Nodes in the graph.
    pub nodes: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graphs {
    pub prefix: GraphEntry,
    pub denoise: GraphEntry,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointInfo {
    pub(crate) path: String,
    /// SHA-256 over the weight files' bytes, in load order.
    pub(crate) sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub(crate) format: String,
    pub(crate) producer: String,
    /// "pi0" or "pi05".
    pub variant: String,
    pub dtype: ExportDtype,
    pub(crate) opset: i64,
    pub batch: usize,
    pub cameras: usize,
    pub prompt_len: usize,
    pub image_size: usize,
    pub(crate) tokens_per_image: usize,
    pub(crate) prefix_len: usize,
    pub(crate) suffix_len: usize,
    pub chunk: usize,
    pub action_dim: usize,
    pub state_dim: usize,
    pub(crate) steps: usize,
    pub(crate) dt: f32,
    pub(crate) layers: usize,
    pub(crate) head_dim: usize,
    pub(crate) kv_dim: usize,
    pub(crate) expert_width: usize,
    pub(crate) vocab: usize,
    /// Additive attention-mask value the bias tables carry.
    pub mask_value: f32,
    pub(crate) min_period: f64,
    pub(crate) max_period: f64,
    /// The denoise graph runs all steps (`noise` -> `actions`) instead of one.
    pub unrolled: bool,
    /// The unrolled graph takes real-time chunking's guidance as inputs (`pi0d export --rtc`).
    #[serde(default)]
    pub rtc: bool,
    /// Exported from a pi0.5 trained for real-time chunking (its `rtc_training_max_delay`): the
    /// denoise graph takes the clamped tokens (`rtc_clean`, and unrolled their values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_rtc: Option<usize>,
    /// The linear layers' weights are stored quantized (`pi0d export --quant`, or a checkpoint
    /// from `pi0d quantize`): the graphs are for ONNX Runtime (com.microsoft `MatMulNBits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<crate::policy::pi0::quant::Scheme>,
    pub graphs: Graphs,
    pub(crate) checkpoint: CheckpointInfo,
}

/// A manifest that cannot drive the graphs; each names the file (and the field).
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: cannot read it")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a pi0d manifest")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: `{field}`: expected {expected}, found {found}")]
    Field {
        path: PathBuf,
        field: String,
        expected: String,
        found: String,
    },
}

/// The most values one host table may hold (`prefix_bias` is `batch x prefix_len^2`): far
/// above any real export, low enough that a corrupt size is refused rather than allocated.
const MAX_TABLE_VALUES: usize = 1 << 31;

/// Whether `file` is a plain relative path (no root, no `..`, not empty).
fn is_plain_relative(file: &str) -> bool {
    !file.is_empty()
        && Path::new(file)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

impl Manifest {
    pub(crate) fn is_pi05(&self) -> bool {
        self.variant == "pi05"
    }

    /// Reads and checks `DIR/manifest.json` (`validate`).
    pub fn load(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Read {
            path: path.clone(),
            source,
        })?;
        let m: Manifest = serde_json::from_str(&text).map_err(|source| ManifestError::Json {
            path: path.clone(),
            source,
        })?;
        m.validate(dir)?;
        Ok(m)
    }

    /// Checks every value a runtime sizes or computes from, and that the graph files are
    /// regular files inside `dir` (a manifest must not point a runtime elsewhere). Each problem
    /// is reported for its own field, with what was expected and what was found.
    pub(crate) fn validate(&self, dir: &Path) -> Result<(), ManifestError> {
        let path = dir.join(FILE);
        let bad = |field: &str, expected: String, found: String| ManifestError::Field {
            path: path.clone(),
            field: field.into(),
            expected,
            found,
        };
        let m = self;
        if m.format != FORMAT {
            return Err(bad(
                "format",
                format!("{FORMAT:?} (the format this pi0d reads)"),
                format!("{:?}", m.format),
            ));
        }
        if m.variant != "pi0" && m.variant != "pi05" {
            return Err(bad(
                "variant",
                "\"pi0\" or \"pi05\"".into(),
                format!("{:?}", m.variant),
            ));
        }
        for (field, v) in [
            ("batch", m.batch),
            ("cameras", m.cameras),
            ("prompt_len", m.prompt_len),
            ("image_size", m.image_size),
            ("tokens_per_image", m.tokens_per_image),
            ("chunk", m.chunk),
            ("action_dim", m.action_dim),
            ("state_dim", m.state_dim),
            ("steps", m.steps),
            ("layers", m.layers),
            ("head_dim", m.head_dim),
            ("kv_dim", m.kv_dim),
            ("expert_width", m.expert_width),
            ("vocab", m.vocab),
        ] {
            if v == 0 {
                return Err(bad(field, "at least 1".into(), "0".into()));
            }
        }
        if !m.head_dim.is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                "an even size (RoPE rotates pairs)".into(),
                m.head_dim.to_string(),
            ));
        }
        if !m.kv_dim.is_multiple_of(m.head_dim) {
            return Err(bad(
                "kv_dim",
                format!("a multiple of head_dim {}", m.head_dim),
                m.kv_dim.to_string(),
            ));
        }
        let prefix = m
            .cameras
            .checked_mul(m.tokens_per_image)
            .and_then(|t| t.checked_add(m.prompt_len));
        if prefix != Some(m.prefix_len) {
            return Err(bad(
                "prefix_len",
                match prefix {
                    Some(p) => format!(
                        "{p} ({} cameras x {} tokens + {} prompt tokens)",
                        m.cameras, m.tokens_per_image, m.prompt_len
                    ),
                    None => "cameras x tokens_per_image + prompt_len, which overflows".into(),
                },
                m.prefix_len.to_string(),
            ));
        }
        let suffix = m.chunk + usize::from(!m.is_pi05());
        if m.suffix_len != suffix {
            return Err(bad(
                "suffix_len",
                format!(
                    "{suffix} (chunk {}{})",
                    m.chunk,
                    if m.is_pi05() {
                        ""
                    } else {
                        " + the state token"
                    }
                ),
                m.suffix_len.to_string(),
            ));
        }
        let (b, p, n) = (m.batch, m.prefix_len, m.suffix_len);
        for (table, size) in [
            (
                "prefix_bias",
                b.checked_mul(p).and_then(|x| x.checked_mul(p)),
            ),
            (
                "suffix_bias",
                b.checked_mul(n)
                    .and_then(|x| x.checked_mul(p.checked_add(n)?)),
            ),
            (
                "time_emb",
                m.steps
                    .checked_mul(b)
                    .and_then(|x| x.checked_mul(m.expert_width)),
            ),
        ] {
            if size.is_none_or(|s| s > MAX_TABLE_VALUES) {
                return Err(bad(
                    "batch",
                    format!("sizes whose `{table}` table holds at most {MAX_TABLE_VALUES} values"),
                    format!(
                        "batch {b}, prefix_len {p}, suffix_len {n}, steps {}",
                        m.steps
                    ),
                ));
            }
        }
        if m.rtc && !m.unrolled {
            return Err(bad(
                "rtc",
                "false for looped graphs (their host driver guides each step)".into(),
                "true".into(),
            ));
        }
        if let Some(d) = m.trained_rtc {
            if !m.is_pi05() || m.rtc || d == 0 || d >= m.chunk {
                return Err(bad(
                    "trained_rtc",
                    format!(
                        "for pi0.5 graphs without --rtc only, a delay from 1 to {} (below the chunk)",
                        m.chunk.saturating_sub(1)
                    ),
                    format!("{d} ({} graphs{})", m.variant, if m.rtc { ", --rtc" } else { "" }),
                ));
            }
        }
        // `pi0d export` writes dt = -1/steps in f32.
        let dt = -1.0 / m.steps as f32;
        if !m.dt.is_finite() || (m.dt - dt).abs() > 1e-6 {
            return Err(bad(
                "dt",
                format!("{dt} (-1 / steps, steps = {})", m.steps),
                m.dt.to_string(),
            ));
        }
        let f16 = m.dtype == ExportDtype::F16;
        let lowest = if f16 {
            -half::f16::MAX.to_f32()
        } else {
            f32::MIN
        };
        if !m.mask_value.is_finite() || m.mask_value >= 0.0 || m.mask_value < lowest {
            return Err(bad(
                "mask_value",
                if f16 {
                    "a negative value within float16's range (-65504..0)".into()
                } else {
                    "a finite negative value".into()
                },
                m.mask_value.to_string(),
            ));
        }
        for (field, v) in [("min_period", m.min_period), ("max_period", m.max_period)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, "a finite period above 0".into(), v.to_string()));
            }
        }
        if m.min_period >= m.max_period {
            return Err(bad(
                "min_period",
                format!("less than max_period ({})", m.max_period),
                m.min_period.to_string(),
            ));
        }
        let root = std::fs::canonicalize(dir).map_err(|source| ManifestError::Read {
            path: dir.into(),
            source,
        })?;
        for (name, g) in [("prefix", &m.graphs.prefix), ("denoise", &m.graphs.denoise)] {
            let files = std::iter::once(("file", &g.file))
                .chain(g.external_data.as_ref().map(|f| ("external_data", f)));
            for (key, f) in files {
                let field = format!("graphs.{name}.{key}");
                if !is_plain_relative(f) {
                    return Err(bad(
                        &field,
                        format!("a relative path inside {}", dir.display()),
                        format!("{f:?}"),
                    ));
                }
                let real = std::fs::canonicalize(dir.join(f)).ok();
                match real {
                    None => {
                        return Err(bad(
                            &field,
                            format!("a file in {}", dir.display()),
                            format!("{f:?}, which is not there"),
                        ))
                    }
                    // A symlink may point anywhere: where it ends up must still be inside.
                    Some(r) if !r.starts_with(&root) => {
                        return Err(bad(
                            &field,
                            format!("a file inside {}", dir.display()),
                            format!("{f:?}, which leads to {}", r.display()),
                        ))
                    }
                    Some(r) if !r.is_file() => {
                        return Err(bad(
                            &field,
                            "a regular file".into(),
                            format!("{f:?}, which is not one"),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change to a manifest.
    type Edit = fn(&mut Manifest);

    /// A directory holding a sound manifest (as export writes it) and its graph files.
    fn export_dir(name: &str) -> (crate::test_dirs::TempDir, Manifest) {
        let dir = crate::test_dirs::TempDir::new(&format!("manifest-{name}"));
        let m = crate::policy::graph::acl::plan::tests::manifest(1, false, "float32");
        for f in [&m.graphs.prefix.file, &m.graphs.denoise.file] {
            std::fs::write(dir.join(f), b"onnx").unwrap();
        }
        (dir, m)
    }

    /// `m` written to `dir` and loaded: the error's text.
    fn refused(dir: &Path, m: &Manifest) -> String {
        std::fs::write(dir.join(FILE), serde_json::to_string_pretty(m).unwrap()).unwrap();
        match Manifest::load(dir) {
            Ok(_) => panic!("manifest accepted: {m:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn when_manifest_is_sound_expect_loaded() {
        let (dir, m) = export_dir("sound");
        std::fs::write(dir.join(FILE), serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(Manifest::load(&dir).unwrap(), m);
    }

    #[test]
    fn when_a_size_is_zero_expect_that_field_named_with_at_least_1() {
        let (dir, good) = export_dir("zero");
        let mut m = good.clone();
        m.steps = 0;
        let e = refused(&dir, &m);
        assert!(
            e.contains("manifest.json") && e.contains("`steps`: expected at least 1, found 0"),
            "{e}"
        );
        for set in [
            (|m: &mut Manifest| m.batch = 0) as Edit,
            |m| m.chunk = 0,
            |m| m.vocab = 0,
            |m| m.head_dim = 0,
            |m| m.expert_width = 0,
        ] {
            let mut m = good.clone();
            set(&mut m);
            let e = refused(&dir, &m);
            assert!(e.contains("expected at least 1, found 0"), "{e}");
        }
    }

    #[test]
    fn when_sizes_do_not_add_up_expect_the_field_and_its_sum() {
        let (dir, good) = export_dir("sums");
        let mut m = good.clone();
        m.prefix_len += 1;
        let e = refused(&dir, &m);
        assert!(
            e.contains(
                "`prefix_len`: expected 304 (1 cameras x 256 tokens + 48 prompt tokens), found 305"
            ),
            "{e}"
        );
        let mut m = good.clone();
        m.suffix_len = 50;
        assert!(refused(&dir, &m).contains("`suffix_len`: expected 51"));
        let mut m = good.clone();
        m.head_dim = 15;
        m.kv_dim = 15;
        assert!(refused(&dir, &m).contains("`head_dim`: expected an even size"));
        let mut m = good.clone();
        m.batch = 1 << 40;
        assert!(refused(&dir, &m).contains("`prefix_bias` table holds at most"));
    }

    #[test]
    fn when_periods_dt_or_mask_value_are_wrong_expect_each_named() {
        let (dir, good) = export_dir("values");
        let cases: [(Edit, &str); 11] = [
            // Training-time RTC is pi0.5's, within the chunk (this export is of pi0).
            (
                |m| m.trained_rtc = Some(8),
                "`trained_rtc`: expected for pi0.5 graphs without --rtc only",
            ),
            (
                |m| {
                    m.variant = "pi05".into();
                    m.suffix_len = m.chunk;
                    m.trained_rtc = Some(m.chunk)
                },
                "`trained_rtc`",
            ),
            (
                |m| m.min_period = 0.0,
                "`min_period`: expected a finite period above 0",
            ),
            (
                |m| m.max_period = -1.0,
                "`max_period`: expected a finite period",
            ),
            (
                |m| m.min_period = 5.0,
                "`min_period`: expected less than max_period (4)",
            ),
            (
                |m| m.dt = 0.1,
                "`dt`: expected -0.1 (-1 / steps, steps = 10), found 0.1",
            ),
            (|m| m.dt = -0.2, "`dt`"),
            (
                |m| m.mask_value = 0.0,
                "`mask_value`: expected a finite negative value",
            ),
            (|m| m.mask_value = 1.0, "`mask_value`"),
            (
                |m| {
                    m.dtype = ExportDtype::F16;
                    m.mask_value = -1e6
                },
                "`mask_value`: expected a negative value within float16's range",
            ),
            (|m| m.format = "pi0d-graphs/9".into(), "pi0d-graphs/9"),
        ];
        for (set, want) in cases {
            let mut m = good.clone();
            set(&mut m);
            let e = refused(&dir, &m);
            assert!(e.contains(want), "{want}: {e}");
        }
        // NaN does not survive JSON (it is written as null): refused as not a manifest.
        let mut m = good.clone();
        m.dt = f32::NAN;
        assert!(refused(&dir, &m).contains("not a pi0d manifest"));
        let mut m = good;
        m.dtype = ExportDtype::F16;
        m.mask_value = -30000.0;
        std::fs::write(dir.join(FILE), serde_json::to_string(&m).unwrap()).unwrap();
        Manifest::load(&dir).unwrap();
    }

    #[test]
    fn when_graph_paths_leave_the_directory_expect_refused_naming_the_field() {
        let (dir, good) = export_dir("paths");
        let beside = crate::test_dirs::TempDir::new("manifest-outside");
        let outside = beside.join("outside.onnx");
        std::fs::write(&outside, b"onnx").unwrap();
        let cases = [
            ("/etc/passwd".to_string(), "graphs.prefix.file"),
            ("../prefix.onnx".to_string(), "graphs.prefix.file"),
            ("sub/../../x.onnx".to_string(), "graphs.prefix.file"),
            (String::new(), "graphs.prefix.file"),
            ("missing.onnx".to_string(), "which is not there"),
        ];
        for (file, want) in cases {
            let mut m = good.clone();
            m.graphs.prefix.file = file.clone();
            let e = refused(&dir, &m);
            assert!(
                e.contains(want) && e.contains("expected a"),
                "{file:?}: {e}"
            );
        }
        // A symlink escaping the directory, as the graph or as its external data.
        std::os::unix::fs::symlink(&outside, dir.join("escape.onnx")).unwrap();
        let mut m = good.clone();
        m.graphs.prefix.file = "escape.onnx".into();
        let e = refused(&dir, &m);
        assert!(
            e.contains("graphs.prefix.file") && e.contains("which leads to"),
            "{e}"
        );
        let mut m = good.clone();
        m.graphs.denoise.external_data = Some("escape.onnx".into());
        let e = refused(&dir, &m);
        assert!(e.contains("graphs.denoise.external_data"), "{e}");
        // A directory is not a graph file; a symlink staying inside is fine.
        std::fs::create_dir_all(dir.join("sub.onnx")).unwrap();
        let mut m = good.clone();
        m.graphs.prefix.file = "sub.onnx".into();
        assert!(refused(&dir, &m).contains("a regular file"));
        std::os::unix::fs::symlink(dir.join("prefix.onnx"), dir.join("inside.onnx")).unwrap();
        let mut m = good;
        m.graphs.prefix.file = "./inside.onnx".into();
        std::fs::write(dir.join(FILE), serde_json::to_string(&m).unwrap()).unwrap();
        Manifest::load(&dir).unwrap();
    }
}
