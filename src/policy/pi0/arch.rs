//! The model's sizes, read from the checkpoint's tensor shapes (`Arch`), and what prompt tokens
//! it takes. Each size comes from every tensor that has it, so one malformed tensor is named by
//! its own shape check instead of making its healthy neighbours look wrong.

use super::checkpoint::{ArchOverrides, Checkpoint, CheckpointError};
use super::model::{EXPERT, LM, LM_HEAD, PROJECTOR, VISION};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Pi0,
    Pi05,
}

/// Sizes read from the checkpoint's tensor shapes (plus head counts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arch {
    pub variant: Variant,
    pub(crate) image_size: usize,
    pub(crate) patch: usize,
    pub(crate) vision_width: usize,
    pub(crate) vision_layers: usize,
    pub(crate) vision_mlp: usize,
    pub(crate) vision_heads: usize,
    pub(crate) width: usize,
    pub(crate) vocab: usize,
    pub(crate) layers: usize,
    pub(crate) mlp: usize,
    pub(crate) expert_width: usize,
    pub(crate) expert_mlp: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub action_dim: usize,
    pub(crate) state_dim: usize,
    pub chunk: usize,
    pub(crate) steps: usize,
}

impl Arch {
    pub fn tokens_per_image(&self) -> usize {
        (self.image_size / self.patch).pow(2)
    }
}

/// Prompt tokens a model cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("{found} prompt tokens, the model takes at most {max}")]
    TooMany { found: usize, max: usize },
    #[error("token id {id} at index {index} is outside the vocabulary (0..{vocab})")]
    OutOfVocabulary { index: usize, id: i64, vocab: usize },
}

/// The first id of `tokens` outside `0..vocab`.
pub(crate) fn check_vocabulary(tokens: &[i64], vocab: usize) -> Result<(), TokenError> {
    match tokens
        .iter()
        .position(|&t| usize::try_from(t).map_or(true, |t| t >= vocab))
    {
        Some(index) => Err(TokenError::OutOfVocabulary {
            index,
            id: tokens[index],
            vocab,
        }),
        None => Ok(()),
    }
}

fn arch_err(ck: &Checkpoint, message: String) -> CheckpointError {
    CheckpointError::Arch {
        path: ck.path.clone(),
        message,
    }
}

/// How a head-count problem is solved, in every place the counts can be given.
const ARCH_HINT: &str =
    "name an arch file with the head counts (--arch, or policy.arch in the config)";

/// A size several tensors must agree on, from `votes` (`(tensor, axis)`; absent tensors and
/// ones without that axis do not vote): the value most of them give. One malformed tensor is
/// then outvoted and refused by its own shape check, naming it, instead of setting a size that
/// makes its healthy neighbours look wrong. A tie is refused naming the tensors on each side.
fn consensus(
    ck: &Checkpoint,
    what: &str,
    votes: &[(String, usize)],
) -> Result<usize, CheckpointError> {
    let mut tally: Vec<(usize, Vec<&str>)> = Vec::new();
    for (name, axis) in votes {
        let Some(v) = ck.find(&[name]).ok().and_then(|e| e.shape.get(*axis)) else {
            continue;
        };
        match tally.iter_mut().find(|(value, _)| value == v) {
            Some((_, names)) => names.push(name),
            None => tally.push((*v, vec![name])),
        }
    }
    tally.sort_by_key(|t| std::cmp::Reverse(t.1.len()));
    match tally.as_slice() {
        [] => {
            let first = votes.first().map(|v| v.0.as_str()).unwrap_or_default();
            Err(ck.find(&[first]).err().unwrap_or_else(|| {
                arch_err(ck, format!("no tensor gives {what}"))
            }))
        }
        [(a, an), (b, bn), ..] if an.len() == bn.len() => Err(arch_err(
            ck,
            format!(
                "tensors disagree on {what}: {a} from `{}`, {b} from `{}`; one of them is malformed",
                an.join("`, `"),
                bn.join("`, `")
            ),
        )),
        // A zero size would make empty layers (and chunked loops over them) downstream.
        [(0, names), ..] => Err(arch_err(
            ck,
            format!("`{}` give {what} 0", names.join("`, `")),
        )),
        [(v, _), ..] => Ok(*v),
    }
}

/// `(tensor, axis)` votes for every layer `0..layers` under `base`: `(suffix, axis)` each.
fn layer_votes(base: &str, layers: usize, parts: &[(&str, usize)]) -> Vec<(String, usize)> {
    (0..layers)
        .flat_map(|i| {
            parts
                .iter()
                .map(move |(n, axis)| (format!("{base}.layers.{i}.{n}"), *axis))
        })
        .collect()
}

fn votes(parts: &[(&str, usize)]) -> Vec<(String, usize)> {
    parts.iter().map(|(n, a)| (n.to_string(), *a)).collect()
}

/// The prompt length a checkpoint takes: `config.json`'s `tokenizer_max_length`, else lerobot's
/// default (48 tokens, pi0.5's 200).
pub(crate) fn prompt_len(config: &super::checkpoint::PolicyConfigJson, variant: Variant) -> usize {
    config
        .tokenizer_max_length
        .unwrap_or(if variant == Variant::Pi05 { 200 } else { 48 })
}

impl Arch {
    /// Reads sizes from tensor shapes (each from every tensor that has it: see `consensus`);
    /// head counts come from `overrides` (an arch file) or default to the real pi0 values when
    /// those fit the shapes.
    pub(crate) fn from_checkpoint(
        ck: &Checkpoint,
        overrides: Option<ArchOverrides>,
    ) -> Result<Arch, CheckpointError> {
        // pi0.5 has time_mlp_* and no state projection (some exports name pi0's action_time_mlp_*
        // time_mlp_* too, so state_proj decides).
        let variant = if (ck.contains("time_mlp_in.weight") && !ck.contains("state_proj.weight"))
            || ck.config.kind == "pi05"
        {
            Variant::Pi05
        } else {
            Variant::Pi0
        };
        let cfg = &ck.config;
        let pe = format!("{VISION}.embeddings.patch_embedding.weight");
        let pos = format!("{VISION}.embeddings.position_embedding.weight");
        let vl = ck.count_layers(&format!("{VISION}.encoder.layers"));
        let enc = format!("{VISION}.encoder");
        let mut vv = votes(&[
            (&pe, 0),
            (&format!("{VISION}.embeddings.patch_embedding.bias"), 0),
            (&pos, 1),
            (&format!("{VISION}.post_layernorm.weight"), 0),
            (&format!("{VISION}.post_layernorm.bias"), 0),
            (&format!("{PROJECTOR}.weight"), 1),
        ]);
        vv.extend(layer_votes(
            &enc,
            vl,
            &[
                ("layer_norm1.weight", 0),
                ("layer_norm2.weight", 0),
                ("self_attn.q_proj.weight", 1),
                ("self_attn.k_proj.weight", 1),
                ("self_attn.v_proj.weight", 1),
                ("self_attn.out_proj.weight", 0),
                ("mlp.fc1.weight", 1),
                ("mlp.fc2.weight", 0),
            ],
        ));
        let vision_width = consensus(ck, "the vision width", &vv)?;
        let patch = consensus(ck, "the patch size", &votes(&[(&pe, 2), (&pe, 3)]))?;
        let positions = consensus(ck, "the number of image patches", &votes(&[(&pos, 0)]))?;
        let side = (positions as f64).sqrt().round() as usize;
        if side * side != positions {
            return Err(arch_err(
                ck,
                format!("tensor `{pos}` has {positions} rows, not a square number of patches"),
            ));
        }
        let [res, res_w] = cfg.image_resolution;
        if res != res_w {
            return Err(arch_err(
                ck,
                format!(
                    "config image_resolution {:?} is not square",
                    cfg.image_resolution
                ),
            ));
        }
        if patch == 0 || side * patch != res {
            // The config's resolution and the patch kernel agree: the position table is wrong.
            if patch > 0 && res.is_multiple_of(patch) {
                return Err(CheckpointError::Shape {
                    path: ck.file_of(ck.find(&[&pos])?).to_path_buf(),
                    name: pos.clone(),
                    expected: vec![(res / patch).pow(2), vision_width],
                    found: ck.find(&[&pos])?.shape.clone(),
                });
            }
            return Err(arch_err(
                ck,
                format!(
                    "config image_resolution {:?} does not match the {}-pixel position embedding ({side}x{side} patches of {patch} pixels)",
                    cfg.image_resolution,
                    side * patch
                ),
            ));
        }
        let embed = ck.find(&[&format!("{LM}.embed_tokens.weight"), LM_HEAD])?;
        let vocab = embed.shape.first().copied().unwrap_or(0);
        if vocab == 0 {
            return Err(arch_err(
                ck,
                format!("tensor `{}` has no rows: an empty vocabulary", embed.name),
            ));
        }
        let layers = ck.count_layers(&format!("{LM}.layers"));
        let expert_layers = ck.count_layers(&format!("{EXPERT}.layers"));
        if layers == 0 || layers != expert_layers {
            return Err(arch_err(ck, format!("language model has {layers} layers and the action expert {expert_layers}: they must be equal and non-zero")));
        }
        let mut wv = vec![
            (embed.name.clone(), 1),
            (format!("{LM}.norm.weight"), 0),
            (format!("{PROJECTOR}.weight"), 0),
            (format!("{PROJECTOR}.bias"), 0),
        ];
        wv.extend(layer_votes(
            LM,
            layers,
            &[
                ("input_layernorm.weight", 0),
                ("post_attention_layernorm.weight", 0),
                ("self_attn.q_proj.weight", 1),
                ("self_attn.k_proj.weight", 1),
                ("self_attn.v_proj.weight", 1),
                ("self_attn.o_proj.weight", 0),
                ("mlp.gate_proj.weight", 1),
                ("mlp.up_proj.weight", 1),
                ("mlp.down_proj.weight", 0),
            ],
        ));
        let width = consensus(ck, "the language model width", &wv)?;
        if embed.shape.len() != 2 {
            return Err(arch_err(
                ck,
                format!(
                    "tensor `{}` has shape {:?}, expected [vocabulary, {width}]",
                    embed.name, embed.shape
                ),
            ));
        }
        let attn = |q: &[(&str, usize)]| {
            let mut v = layer_votes(LM, layers, q);
            v.extend(layer_votes(EXPERT, layers, q));
            v
        };
        let q_out = consensus(
            ck,
            "the query width (heads x head_dim)",
            &attn(&[
                ("self_attn.q_proj.weight", 0),
                ("self_attn.o_proj.weight", 1),
            ]),
        )?;
        let k_out = consensus(
            ck,
            "the key/value width (KV heads x head_dim)",
            &attn(&[
                ("self_attn.k_proj.weight", 0),
                ("self_attn.v_proj.weight", 0),
            ]),
        )?;
        let o = overrides.or(ck.arch_file).unwrap_or(ArchOverrides::PI0);
        if o.heads * o.head_dim != q_out
            || o.kv_heads * o.head_dim != k_out
            || !o.heads.is_multiple_of(o.kv_heads)
        {
            return Err(arch_err(
                ck,
                format!(
                    "q_proj has {q_out} and k_proj {k_out} outputs, which {} heads / {} KV heads of {} do not give: {ARCH_HINT}",
                    o.heads, o.kv_heads, o.head_dim
                ),
            ));
        }
        if !vision_width.is_multiple_of(o.vision_heads) {
            return Err(arch_err(
                ck,
                format!(
                    "vision width {vision_width} is not divisible by {} heads: {ARCH_HINT}",
                    o.vision_heads
                ),
            ));
        }
        let mut ev = votes(&[
            ("action_in_proj.weight", 0),
            ("action_in_proj.bias", 0),
            ("action_out_proj.weight", 1),
            ("state_proj.weight", 0),
            ("state_proj.bias", 0),
            ("time_mlp_in.weight", 0),
            ("time_mlp_out.weight", 0),
            ("time_mlp_out.weight", 1),
            ("action_time_mlp_in.weight", 0),
            ("action_time_mlp_out.weight", 0),
            ("action_time_mlp_out.weight", 1),
            (&format!("{EXPERT}.norm.weight"), 0),
            (&format!("{EXPERT}.norm.dense.weight"), 1),
        ]);
        ev.extend(layer_votes(
            EXPERT,
            layers,
            &[
                ("input_layernorm.weight", 0),
                ("input_layernorm.dense.weight", 1),
                ("post_attention_layernorm.weight", 0),
                ("post_attention_layernorm.dense.weight", 1),
                ("self_attn.q_proj.weight", 1),
                ("self_attn.k_proj.weight", 1),
                ("self_attn.v_proj.weight", 1),
                ("self_attn.o_proj.weight", 0),
                ("mlp.gate_proj.weight", 1),
                ("mlp.up_proj.weight", 1),
                ("mlp.down_proj.weight", 0),
            ],
        ));
        let expert_width = consensus(ck, "the action expert width", &ev)?;
        let mlp_votes = |base: &str| {
            layer_votes(
                base,
                layers,
                &[
                    ("mlp.gate_proj.weight", 0),
                    ("mlp.up_proj.weight", 0),
                    ("mlp.down_proj.weight", 1),
                ],
            )
        };
        let action_dim = consensus(
            ck,
            "the action width",
            &votes(&[
                ("action_out_proj.weight", 0),
                ("action_out_proj.bias", 0),
                ("action_in_proj.weight", 1),
            ]),
        )?;
        let vision_mlp = consensus(
            ck,
            "the vision MLP width",
            &layer_votes(
                &enc,
                vl,
                &[
                    ("mlp.fc1.weight", 0),
                    ("mlp.fc1.bias", 0),
                    ("mlp.fc2.weight", 1),
                ],
            ),
        )?;
        Ok(Arch {
            variant,
            image_size: res,
            patch,
            vision_width,
            vision_layers: vl,
            vision_mlp,
            vision_heads: o.vision_heads,
            width,
            vocab,
            layers,
            mlp: consensus(ck, "the language model MLP width", &mlp_votes(LM))?,
            expert_width,
            expert_mlp: consensus(ck, "the action expert MLP width", &mlp_votes(EXPERT))?,
            heads: o.heads,
            kv_heads: o.kv_heads,
            head_dim: o.head_dim,
            action_dim,
            state_dim: cfg.max_state_dim,
            chunk: cfg.chunk_size,
            steps: cfg.num_inference_steps,
        })
    }
}

/// lerobot's Euler schedule for the flow: `steps` steps of `dt = -1 / steps` from time 1, in
/// f64 as its Python floats are (the real-time chunking weight is computed from the time).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Euler {
    pub(crate) dt: f64,
}

impl Euler {
    pub(crate) fn new(steps: usize) -> Euler {
        Euler {
            dt: -1.0 / steps as f64,
        }
    }

    /// The time at the start of `step`.
    pub(crate) fn time(self, step: usize) -> f64 {
        1.0 + step as f64 * self.dt
    }

    /// One step: `x += dt * v`.
    pub(crate) fn advance(self, x: &mut [f32], v: &[f32]) {
        let dt = self.dt as f32;
        x.iter_mut().zip(v).for_each(|(x, v)| *x += dt * v);
    }
}
