//! The policy side refusing bad input: broken checkpoints (config, shapes, headers, stats),
//! inputs files, prompts and exports, each refused with a message naming the file and the
//! tensor, field or stat, never a panic; non-finite results reported as runtime failures.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::TempDir;
use safetensors::Dtype;
use serde_json::Value;

use pi0d::config::BackendOptions;
use pi0d::observation::{CameraFrame, PixelFormat};
use pi0d::policy::export::pi0::ExportDtype;
use pi0d::policy::export::{export, ExportError, ExportOptions};
use pi0d::policy::graph::manifest::Manifest;
use pi0d::policy::graph::GraphError;
use pi0d::policy::pi0::infer::{self, Batch, InferError};
use pi0d::policy::pi0::pipeline::{Pi0Pipeline, PipelineError, PipelineOptions, MAX_PROMPT_BYTES};
use pi0d::policy::pi0::tensorfile::TensorFile;
use pi0d::policy::pi0::{Checkpoint, Pi0Model};
use pi0d::time::MonoTime;

type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;
/// Stats and the lengths they are cut or padded to.
type Resizes = &'static [(&'static str, usize)];

fn fixture(name: &str) -> PathBuf {
    common::root().join("tests/fixtures").join(name)
}

/// A scratch directory, removed when the guard drops (even when the test panics).
fn scratch(name: &str) -> TempDir {
    TempDir::new(&format!("inputs-{name}"))
}

fn read_tensors(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(n, v)| {
            let (d, s) = (v.dtype(), v.shape().to_vec());
            (n.to_string(), d, s, v.data().to_vec())
        })
        .collect()
}

fn write_tensors(path: &Path, tensors: &Tensors) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            let view = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A full copy of the tiny f32 pi0 checkpoint (stats, tokenizer and all), with `edit` applied
/// to its weights.
fn checkpoint_copy(name: &str, edit: impl Fn(&mut Tensors)) -> TempDir {
    let src = fixture("pi0_float32");
    let dir = scratch(name);
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    let mut t = read_tensors(&src.join("model.safetensors"));
    edit(&mut t);
    write_tensors(&dir.join("model.safetensors"), &t);
    dir
}

/// `name`'s tensor given `shape`, its data cut or zero-padded to fit.
fn reshape(t: &mut Tensors, name: &str, shape: &[usize]) {
    let x = t.iter_mut().find(|x| x.0 == name).unwrap();
    x.2 = shape.to_vec();
    x.3.resize(shape.iter().product::<usize>() * 4, 0);
}

/// Stat `name` in a stats file cut (or zero-extended) to `len` values.
fn resize_stat(path: &Path, name: &str, len: usize) {
    let mut t = read_tensors(path);
    reshape(&mut t, name, &[len]);
    write_tensors(path, &t);
}

fn options(checkpoint: PathBuf) -> PipelineOptions {
    PipelineOptions {
        checkpoint,
        arch: None,
        tokenizer: None,
        threads: 1,
        backend: BackendOptions::Cpu,
        openpi_delta_actions: None,
    }
}

fn pipeline(checkpoint: PathBuf) -> Pi0Pipeline {
    match Pi0Pipeline::load(&options(checkpoint)) {
        Ok(p) => p,
        Err(e) => panic!("{:#}", anyhow::Error::from(e)),
    }
}

/// The error loading `opts` gives, as the binary prints it (`{:#}`: with its sources).
fn load_error(opts: &PipelineOptions) -> String {
    match Pi0Pipeline::load(opts) {
        Ok(_) => panic!("{} loaded", opts.checkpoint.display()),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    }
}

fn checkpoint_error(dir: &Path) -> String {
    let e = match Checkpoint::load(dir) {
        Ok(ck) => match Pi0Model::load(&ck, None, 1) {
            Ok(_) => panic!("{} loaded", dir.display()),
            Err(e) => e,
        },
        Err(e) => e,
    };
    format!("{:#}", anyhow::Error::from(e))
}

const PREPROCESSOR_STATS: &str = "policy_preprocessor_step_6_normalizer_processor.safetensors";
const POSTPROCESSOR_STATS: &str = "policy_postprocessor_step_0_unnormalizer_processor.safetensors";

#[test]
fn when_checkpoint_dir_has_no_config_json_expect_refusal_naming_it() {
    let dir = checkpoint_copy("no-config", |_| {});
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = checkpoint_error(&dir);
    assert_eq!(
        e,
        format!(
            "{}: no config.json (a lerobot checkpoint directory holds config.json beside model.safetensors)",
            dir.display()
        )
    );
    // The pipeline says the same, not a joint-count mismatch later on.
    assert!(load_error(&options(dir.to_path_buf())).contains("no config.json"));
}

#[test]
fn when_bare_safetensors_file_expect_width_errors_to_say_why() {
    // No config.json names the robot's widths: the stats (7 joints) are measured against the
    // model's padded 32, and the message says that is where 32 comes from.
    let e = load_error(&options(fixture("pi0_float32/model.safetensors")));
    assert!(
        e.contains(PREPROCESSOR_STATS)
            && e.contains("`observation.state.mean` has 7 values, expected 32")
            && e.contains("bare safetensors file, with no config.json"),
        "{e}"
    );
}

#[test]
fn when_config_or_index_json_is_wrong_expect_file_and_field_named() {
    let dir = checkpoint_copy("bad-json", |_| {});
    let cfg = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("\"chunk_size\": 50", "\"chunk_size\": \"50\""),
    )
    .unwrap();
    let e = checkpoint_error(&dir);
    assert!(
        e.contains("config.json: field `chunk_size`") && e.contains("string"),
        "{e}"
    );
    std::fs::write(&cfg, &text[..text.len() / 2]).unwrap();
    let e = checkpoint_error(&dir);
    assert!(
        e.contains("config.json: not valid JSON") && e.contains("line"),
        "{e}"
    );
    std::fs::write(
        &cfg,
        text.replace("\"num_inference_steps\": 10", "\"num_inference_steps\": 0"),
    )
    .unwrap();
    let e = checkpoint_error(&dir);
    assert!(
        e.contains("`num_inference_steps`: expected at least 1, found 0"),
        "{e}"
    );
    std::fs::write(&cfg, &text).unwrap();
    std::fs::write(
        dir.join("arch.json"),
        r#"{"vision_heads": 4, "heads": 8, "kv_heads": "1", "head_dim": 16}"#,
    )
    .unwrap();
    let e = checkpoint_error(&dir);
    assert!(e.contains("arch.json: field `kv_heads`"), "{e}");
    std::fs::copy(fixture("pi0_float32/arch.json"), dir.join("arch.json")).unwrap();

    // Sharded: every shard must be a file name inside the directory, and there.
    std::fs::rename(
        dir.join("model.safetensors"),
        dir.join("shard-1.safetensors"),
    )
    .unwrap();
    let index = dir.join("model.safetensors.index.json");
    let names: Vec<String> = read_tensors(&dir.join("shard-1.safetensors"))
        .into_iter()
        .map(|t| t.0)
        .collect();
    let weight_map = |shard: &str| {
        let map: serde_json::Map<String, Value> = names
            .iter()
            .map(|n| (n.clone(), Value::String(shard.into())))
            .collect();
        serde_json::json!({ "weight_map": map }).to_string()
    };
    std::fs::write(&index, weight_map("shard-1.safetensors")).unwrap();
    Checkpoint::load(&dir).unwrap();
    for (shard, want) in [
        ("../shard-1.safetensors", "not a file name inside"),
        ("/etc/passwd", "not a file name inside"),
        (
            "shard-2.safetensors",
            "names shard `shard-2.safetensors`, which is not in",
        ),
    ] {
        std::fs::write(&index, weight_map(shard)).unwrap();
        let e = checkpoint_error(&dir);
        assert!(
            e.contains("model.safetensors.index.json") && e.contains(want),
            "{shard}: {e}"
        );
    }
}

const VISION: &str = "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model";
const LM: &str = "model.paligemma_with_expert.paligemma.model.language_model";
const EXPERT: &str = "model.paligemma_with_expert.gemma_expert.model";

#[test]
fn when_one_tensor_has_a_bad_shape_expect_that_tensor_named_not_a_neighbour() {
    let cases: Vec<(String, Vec<usize>, Vec<usize>)> = vec![
        (
            format!("{VISION}.encoder.layers.0.mlp.fc1.weight"),
            vec![48, 32],
            vec![64, 32],
        ),
        (
            format!("{VISION}.embeddings.patch_embedding.weight"),
            vec![30, 3, 14, 14],
            vec![32, 3, 14, 14],
        ),
        (
            format!("{LM}.layers.0.self_attn.q_proj.weight"),
            vec![120, 64],
            vec![128, 64],
        ),
        (
            format!("{LM}.layers.0.self_attn.k_proj.weight"),
            vec![12, 64],
            vec![16, 64],
        ),
        (
            format!("{LM}.layers.0.self_attn.v_proj.weight"),
            vec![16, 60],
            vec![16, 64],
        ),
        (
            format!("{LM}.layers.0.mlp.gate_proj.weight"),
            vec![96, 64],
            vec![128, 64],
        ),
        (
            format!("{LM}.embed_tokens.weight"),
            vec![320, 60],
            vec![320, 64],
        ),
        (
            "model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"
                .into(),
            vec![64, 30],
            vec![64, 32],
        ),
        (
            format!("{EXPERT}.layers.0.self_attn.q_proj.weight"),
            vec![128, 30],
            vec![128, 32],
        ),
        (
            format!("{EXPERT}.layers.0.mlp.up_proj.weight"),
            vec![48, 32],
            vec![64, 32],
        ),
        (
            "model.action_out_proj.weight".into(),
            vec![7, 32],
            vec![32, 32],
        ),
    ];
    for (name, bad, want) in cases {
        let dir = common::edited_checkpoint("shape-blame", |t| reshape(t, &name, &bad));
        let e = checkpoint_error(&dir);
        let short = name.trim_start_matches("model.");
        assert!(
            e.contains(&format!(
                "tensor `{short}` has shape {bad:?}, expected {want:?}"
            )),
            "{name}: {e}"
        );
    }
    // Found under an alias (lm_head in place of embed_tokens): the alias is named.
    let dir = common::edited_checkpoint("alias-blame", |t| {
        t.retain(|x| !x.0.ends_with("embed_tokens.weight"));
        reshape(
            t,
            "model.paligemma_with_expert.paligemma.lm_head.weight",
            &[320, 60],
        );
    });
    let e = checkpoint_error(&dir);
    assert!(
        e.contains("tensor `paligemma_with_expert.paligemma.lm_head.weight` has shape [320, 60], expected [320, 64]"),
        "{e}"
    );
}

/// `src`'s safetensors file with its header edited (`edit` on the JSON), written to `dst`.
fn edit_header(src: &Path, dst: &Path, edit: impl Fn(&mut serde_json::Map<String, Value>)) {
    let b = std::fs::read(src).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let mut h: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    edit(&mut h);
    let mut text = serde_json::to_string(&h).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&b[8 + n..]);
    std::fs::write(dst, out).unwrap();
}

#[test]
fn when_data_offsets_run_past_the_end_or_overlap_expect_that_tensor_named() {
    let dir = checkpoint_copy("offsets", |_| {});
    let model = dir.join("model.safetensors");
    let src = fixture("pi0_float32/model.safetensors");
    let data_len = read_tensors(&src).iter().map(|t| t.3.len()).sum::<usize>();
    edit_header(&src, &model, |h| {
        h["model.action_in_proj.bias"]["data_offsets"] =
            serde_json::json!([data_len, data_len + 128]);
    });
    let e = checkpoint_error(&dir);
    assert!(
        e.contains("model.safetensors: not a valid safetensors file")
            && e.contains(&format!("tensor `model.action_in_proj.bias`: data_offsets [{data_len}, {}] run past the end", data_len + 128))
            && !e.contains("action_in_proj.weight"),
        "{e}"
    );
    edit_header(&src, &model, |h| {
        h["model.action_in_proj.weight"]["data_offsets"] = serde_json::json!([0, 4096]);
    });
    let e = checkpoint_error(&dir);
    assert!(
        e.contains("`model.action_in_proj.bias`")
            && e.contains("`model.action_in_proj.weight`")
            && e.contains("overlap"),
        "{e}"
    );
    // The inputs files of `pi0d infer` go through the same check.
    let inputs = dir.join("inputs.safetensors");
    edit_header(
        &fixture("cases/pi0_f32_1cam_short/inputs.safetensors"),
        &inputs,
        |h| {
            h["state"]["data_offsets"] = serde_json::json!([1u64, 1u64 << 40]);
        },
    );
    let e = match TensorFile::read(&inputs) {
        Ok(_) => panic!("read"),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    };
    assert!(
        e.contains("tensor `state`: data_offsets") && e.contains("past the end"),
        "{e}"
    );
}

#[test]
fn when_weights_file_is_a_directory_or_fifo_expect_what_it_is_named() {
    let dir = checkpoint_copy("not-a-file", |_| {});
    let model = dir.join("model.safetensors");
    std::fs::remove_file(&model).unwrap();
    std::fs::create_dir(&model).unwrap();
    assert_eq!(
        checkpoint_error(&dir),
        format!(
            "{} is a directory, expected a safetensors file",
            model.display()
        )
    );
    std::fs::remove_dir(&model).unwrap();
    let c = std::ffi::CString::new(model.display().to_string()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other preconditions.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert_eq!(
        checkpoint_error(&dir),
        format!("{} is a FIFO, expected a safetensors file", model.display())
    );
    let e = match TensorFile::read(&dir) {
        Ok(_) => panic!("read a directory"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("is a directory, expected a safetensors file"),
        "{e}"
    );
}

#[test]
fn when_normalizer_stats_do_not_cover_the_widths_expect_refusal_naming_file_and_stat() {
    // (stats file, stats resized to lengths, expected message)
    let cases: [(&str, Resizes, &str); 5] = [
        // A short mean (std is fine).
        (
            PREPROCESSOR_STATS,
            &[("observation.state.mean", 5)],
            "stat `observation.state.mean` has 5 values, expected 7 (the state width, from ",
        ),
        // Mean and std of different lengths, std short.
        (
            PREPROCESSOR_STATS,
            &[("observation.state.std", 6)],
            "stat `observation.state.std` has 6 values, expected 7",
        ),
        // Both longer than the width but unequal: which one is right?
        (
            PREPROCESSOR_STATS,
            &[("observation.state.mean", 9), ("observation.state.std", 8)],
            "stat `observation.state.mean` has 9 values and `observation.state.std` 8",
        ),
        // Every stat equally short: the extra joints would go unnormalized.
        (
            PREPROCESSOR_STATS,
            &[("observation.state.mean", 5), ("observation.state.std", 5)],
            "stat `observation.state.mean` has 5 values, expected 7",
        ),
        (
            POSTPROCESSOR_STATS,
            &[("action.mean", 6), ("action.std", 6)],
            "stat `action.mean` has 6 values, expected 7 (the action width",
        ),
    ];
    for (file, edits, want) in cases {
        let dir = checkpoint_copy("short-stats", |_| {});
        for (stat, len) in edits {
            resize_stat(&dir.join(file), stat, *len);
        }
        let e = load_error(&options(dir.to_path_buf()));
        assert!(
            e.contains(&format!("{}: {want}", dir.join(file).display())),
            "{edits:?}: {e}"
        );
    }
    // Longer than the width, equal: used (the first 7 values), with a warning.
    let dir = checkpoint_copy("long-stats", |_| {});
    for stat in ["observation.state.mean", "observation.state.std"] {
        resize_stat(&dir.join(PREPROCESSOR_STATS), stat, 9);
    }
    let mut p = pipeline(dir.to_path_buf());
    let noise = vec![0.1f32; 50 * 32];
    let (a, _) = p.run(&[], &[0.0; 7], "go", &noise).unwrap();
    assert_eq!(a[0].len(), 7);
}

#[test]
fn when_openpi_norm_stats_hold_a_non_number_expect_the_entry_named() {
    let dir = checkpoint_copy("openpi", |_| {});
    for f in ["policy_preprocessor.json", "policy_postprocessor.json"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let stats = |mean: Value, std: Value| {
        serde_json::json!({"norm_stats": {
            "state": {"mean": mean, "std": std},
            "actions": {"mean": vec![0.0; 7], "std": vec![1.0; 7]},
        }})
        .to_string()
    };
    let path = dir.join("norm_stats.json");
    let (zeros, ones) = (Value::from(vec![0.0; 7]), Value::from(vec![1.0; 7]));
    std::fs::write(&path, stats(zeros, ones.clone())).unwrap();
    pipeline(dir.to_path_buf());
    let text = serde_json::json!([0.0, "x", 0.0, 0.0, 0.0, 0.0, 0.0]);
    std::fs::write(&path, stats(text, ones)).unwrap();
    let e = load_error(&options(dir.to_path_buf()));
    assert!(
        e.contains("norm_stats.json: `state.mean[1]` is \"x\", not a finite number"),
        "{e}"
    );
    let (zeros, ones) = (Value::from(vec![0.0; 4]), Value::from(vec![1.0; 4]));
    std::fs::write(&path, stats(zeros, ones)).unwrap();
    let e = load_error(&options(dir.to_path_buf()));
    assert!(
        e.contains("norm_stats.json: stat `observation.state.mean` has 4 values, expected 7"),
        "{e}"
    );
}

/// The short case's inputs with `edit` applied, in a scratch dir (the guard) as
/// `inputs.safetensors` (the path).
fn inputs_with(name: &str, edit: impl Fn(&mut Tensors)) -> (TempDir, PathBuf) {
    let mut t = read_tensors(&fixture("cases/pi0_f32_1cam_short/inputs.safetensors"));
    edit(&mut t);
    let dir = scratch(name);
    let path = dir.join("inputs.safetensors");
    write_tensors(&path, &t);
    (dir, path)
}

fn set_token(t: &mut Tensors, index: usize, id: i64) {
    let x = t.iter_mut().find(|x| x.0 == "lang_tokens").unwrap();
    x.3[index * 8..index * 8 + 8].copy_from_slice(&id.to_le_bytes());
}

#[test]
fn when_inputs_hold_out_of_vocabulary_or_too_many_tokens_expect_refused_naming_them() {
    let ck = Checkpoint::load(&fixture("pi0_float32")).unwrap();
    let model = Pi0Model::load(&ck, None, 1).unwrap();
    let read_err = |path: &Path| match Batch::read(path, &model) {
        Ok(_) => panic!("{} read", path.display()),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    };
    for (id, index) in [(320i64, 3usize), (-1, 0), (i64::MAX, 47)] {
        let (_dir, path) = inputs_with("vocab", |t| set_token(t, index, id));
        let e = read_err(&path);
        assert!(
            e.contains("tensor `lang_tokens`, batch element 0")
                && e.contains(&format!(
                    "token id {id} at index {index} is outside the vocabulary (0..320)"
                )),
            "{e}"
        );
    }
    let (_dir, path) = inputs_with("long", |t| {
        for name in ["lang_tokens", "lang_masks"] {
            let x = t.iter_mut().find(|x| x.0 == name).unwrap();
            let per = x.3.len() / 48;
            x.2 = vec![1, 49];
            x.3.resize(49 * per, 0);
        }
    });
    assert!(read_err(&path).contains("49 prompt tokens, the model takes at most 48"));
}

#[test]
fn when_tokenizer_has_ids_past_the_embedding_expect_refused_naming_both() {
    let dir = checkpoint_copy("small-vocab", |t| {
        for n in ["embed_tokens.weight", "paligemma.lm_head.weight"] {
            let name = t.iter().find(|x| x.0.ends_with(n)).unwrap().0.clone();
            reshape(t, &name, &[100, 64]);
        }
    });
    let e = load_error(&options(dir.to_path_buf()));
    assert!(
        e.contains(&format!(
            "{}: the tokenizer has ids up to 166",
            dir.join("tokenizer.json").display()
        )) && e.contains("has 100 rows"),
        "{e}"
    );
}

#[test]
fn when_prompt_is_200_kb_expect_refused_quickly() {
    let mut p = pipeline(fixture("pi0_float32"));
    let task = "pick up the cube ".repeat(12_000);
    assert!(task.len() > 200_000);
    let started = Instant::now();
    let noise = vec![0.0f32; 50 * 32];
    match p.run(&[], &[0.0; 7], &task, &noise) {
        Err(PipelineError::PromptTooLong { bytes }) => assert_eq!(bytes, task.len()),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a {}-byte prompt was run", task.len()),
    }
    assert!(matches!(
        p.tokenize(&task),
        Err(PipelineError::PromptTooLong { .. })
    ));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let e = p
        .tokenize(&task)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains(&format!("longer than the {MAX_PROMPT_BYTES} taken")),
        "{e}"
    );
    // A prompt of the largest task length still tokenizes.
    let longest = "a".repeat(MAX_PROMPT_BYTES);
    p.tokenize(&p.prompt(&longest, &[0.0; 7])).unwrap();
    p.run(&[], &[0.0; 7], &longest, &noise).unwrap();
}

#[test]
fn when_frame_is_empty_expect_pipeline_error_naming_the_camera() {
    let mut p = pipeline(fixture("pi0_float32"));
    let empty = CameraFrame {
        stamp: MonoTime::ZERO,
        width: 0,
        height: 480,
        format: PixelFormat::Rgb8,
        data: Vec::new(),
    };
    let e = match p.run(&[None, Some(&empty)], &[0.0; 7], "go", &vec![0.0; 50 * 32]) {
        Ok(_) => panic!("an empty frame was run"),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    };
    assert_eq!(e, "camera 1: camera frame: 0x480 is empty");
}

/// The tiny checkpoint with an action projection so large that every step overflows.
fn overflowing_checkpoint(name: &str) -> TempDir {
    checkpoint_copy(name, |t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "model.action_out_proj.weight")
            .unwrap();
        for v in x.3.chunks_exact_mut(4) {
            v.copy_from_slice(&f32::MAX.to_le_bytes());
        }
    })
}

#[test]
fn when_computation_gives_non_finite_actions_expect_runtime_error_not_actions() {
    let dir = overflowing_checkpoint("nan-actions");
    let mut p = pipeline(dir.to_path_buf());
    match p.run(&[], &[0.1; 7], "go", &vec![0.5; 50 * 32]) {
        Err(e @ PipelineError::NonFiniteActions(_)) => assert!(!e.is_input_error()),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("non-finite actions passed on"),
    }
    // `pi0d infer`'s functions: the batch runner and the writer both refuse them.
    let ck = Checkpoint::load(&dir).unwrap();
    let model = Pi0Model::load(&ck, None, 1).unwrap();
    let case = fixture("cases/pi0_f32_1cam_short/inputs.safetensors");
    let batch = Batch::read(&case, &model).unwrap();
    let e = match infer::try_run_batch(&model, &batch) {
        Err(e) => e,
        Ok(_) => panic!("non-finite actions returned"),
    };
    assert!(matches!(e, InferError::NonFiniteActions(ref n) if n.batch == 0));
    assert!(!e.is_input_error() && !infer::is_input_error(&e));
    let (actions, _) = infer::run_batch(&model, &batch);
    let out = dir.join("actions.safetensors");
    assert!(matches!(
        infer::write_actions(&out, &batch, &actions),
        Err(InferError::NonFiniteActions(_))
    ));
    assert!(!out.exists());
    // The binary does not exit 0 on them, and writes nothing.
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_pi0d"))
        .args(["infer", "--threads", "1", "--checkpoint"])
        .arg(&dir)
        .arg("--inputs")
        .arg(&case)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && stderr.contains("non-finite action"),
        "{stderr}"
    );
    assert!(!out.exists());
}

#[test]
fn when_errors_are_classified_expect_inputs_apart_from_runtime_failures() {
    let bad_inputs = match TensorFile::read(Path::new("/nonexistent/inputs.safetensors")) {
        Err(e) => InferError::File(e),
        Ok(_) => panic!("read"),
    };
    assert!(bad_inputs.is_input_error());
    let with_context = anyhow::Error::from(bad_inputs).context("reading the inputs");
    assert!(infer::is_input_error(&*with_context));
    let write = ExportError::Io {
        path: "out".into(),
        source: std::io::Error::other("disk full"),
    };
    assert!(!write.is_input_error());
    let runtime = anyhow::Error::from(GraphError::Runtime("run failed".into())).context("infer");
    assert!(!infer::is_input_error(&*runtime));
    assert!(GraphError::Load("no library".into()).is_input_error());
    let ck = match Checkpoint::load(Path::new("/nonexistent")) {
        Err(e) => e,
        Ok(_) => panic!("loaded"),
    };
    assert!(ExportError::from(ck).is_input_error());
}

/// Every part of `e`'s chain says something its sources do not.
fn assert_said_once(e: anyhow::Error) {
    let parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    for (i, p) in parts.iter().enumerate() {
        for q in &parts[i + 1..] {
            assert!(
                !p.contains(q.as_str()),
                "`{p}` repeats its source `{q}` in {e:#}"
            );
        }
    }
}

#[test]
fn when_errors_are_shown_with_their_sources_expect_each_fact_once() {
    let denied = ExportError::Io {
        path: "out/prefix.onnx".into(),
        source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied"),
    };
    let shown = format!("{:#}", anyhow::Error::from(denied));
    assert_eq!(shown, "out/prefix.onnx: cannot write it: permission denied");
    let dir = scratch("chains");
    std::fs::write(dir.join("file"), b"x").unwrap();
    let export_err = export(&ExportOptions::new(
        fixture("pi0_float32"),
        dir.join("file/out"),
        1,
    ))
    .err()
    .unwrap();
    assert_said_once(export_err.into());
    let missing = Checkpoint::load(&dir.join("missing.safetensors"))
        .err()
        .unwrap();
    assert_said_once(missing.into());
    let ck = checkpoint_copy("chains-config", |_| {});
    std::fs::write(ck.join("config.json"), "{").unwrap();
    assert_said_once(Checkpoint::load(&ck).err().unwrap().into());
    std::fs::copy(fixture("pi0_float32/config.json"), ck.join("config.json")).unwrap();
    std::fs::write(ck.join("tokenizer.json"), "{").unwrap();
    let e = match Pi0Pipeline::load(&options(ck.to_path_buf())) {
        Err(e) => e,
        Ok(_) => panic!("loaded a broken tokenizer"),
    };
    assert!(matches!(e, PipelineError::Tokenizer { .. }));
    assert_said_once(e.into());
    assert_said_once(GraphError::from(Manifest::load(&dir).err().unwrap()).into());
    assert_said_once(TensorFile::read(&dir.join("none")).err().unwrap().into());
}

/// Whatever sits beside `out` that the export made (temporary or replaced directories).
fn leftovers(out: &Path) -> Vec<PathBuf> {
    let name = out.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&name) && n != name
        })
        .collect()
}

#[test]
fn when_export_fails_midway_expect_no_partial_files_and_older_export_kept() {
    let ck = common::edited_checkpoint("export-f16", |t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "model.action_out_proj.weight")
            .unwrap();
        x.3[..4].copy_from_slice(&1.0e6f32.to_le_bytes());
    });
    let dir = scratch("export-atomic");
    let out = dir.join("graphs");
    let mut opts = ExportOptions::new(ck.to_path_buf(), out.clone(), 1);
    opts.dtype = ExportDtype::F16;
    // A fresh target: nothing at all is left.
    assert!(matches!(
        export(&opts),
        Err(ExportError::F16Overflow { .. })
    ));
    assert!(!out.exists(), "partial export left in {}", out.display());
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    // An older export stays exactly as it was.
    opts.dtype = ExportDtype::F32;
    export(&opts).unwrap();
    let prefix = std::fs::read(out.join("prefix.onnx")).unwrap();
    opts.dtype = ExportDtype::F16;
    assert!(export(&opts).is_err());
    assert_eq!(std::fs::read(out.join("prefix.onnx")).unwrap(), prefix);
    assert_eq!(Manifest::load(&out).unwrap().dtype, ExportDtype::F32);
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
    // A successful export replaces it whole: no file of the old one remains.
    opts.dtype = ExportDtype::F32;
    opts.unroll = true;
    export(&opts).unwrap();
    assert!(out.join("denoise_unrolled.onnx").exists());
    assert!(!out.join("denoise_step.onnx").exists());
    assert!(leftovers(&out).is_empty(), "{:?}", leftovers(&out));
}
