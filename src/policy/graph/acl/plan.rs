//! Device memory for the two graphs, planned once from the manifest: one buffer per input and
//! output, the KV cache shared (the prefix writes it, every step reads it in place), `x`
//! ping-ponging between two buffers so the steps chain on the device, and every step's time
//! embedding in one buffer read at its step's offset. Per observation the host uploads the
//! inputs and reads back only the final actions.

use crate::policy::export::pi0::names;
use crate::policy::graph::manifest::{IoSpec, Manifest};

/// A device allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Buffer {
    pub(crate) name: String,
    pub(crate) bytes: usize,
}

/// A region of a buffer bound to a model input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) buffer: usize,
    pub(crate) offset: usize,
    pub(crate) bytes: usize,
}

/// One model execution: its input and output slots in the model's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Execution {
    pub(crate) inputs: Vec<Slot>,
    pub(crate) outputs: Vec<Slot>,
}

/// What the host writes into a buffer before a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostSource {
    Image(usize),
    Tokens,
    PrefixBias,
    PrefixCos,
    PrefixSin,
    State,
    Noise,
    Time,
    SuffixBias,
    SuffixCos,
    SuffixSin,
    RtcTarget,
    RtcWeights,
    RtcGuidance,
    RtcClean,
    RtcCleanValues,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BufferPlan {
    pub(crate) buffers: Vec<Buffer>,
    pub(crate) prefix: Execution,
    /// One per denoise-graph run: every step when looped, one when unrolled.
    pub(crate) denoise: Vec<Execution>,
    /// Host data uploaded per observation, and where to.
    pub(crate) uploads: Vec<(HostSource, usize)>,
    /// Where the actions are after the last run.
    pub(crate) result: Slot,
    /// Which of a denoise run's inputs is `x` (where a host-guided step writes its `x`).
    pub(crate) x_input: usize,
}

/// Why the manifest's graphs (or a model compiled from them) cannot be bound.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("`{name}` has dtype {dtype}, which pi0d does not bind")]
    Dtype { name: String, dtype: String },
    #[error("{graph} graph input `{name}` is not one pi0d feeds")]
    NotFed { graph: &'static str, name: String },
    #[error("the prefix graph has {found} outputs, expected kv_cache only")]
    PrefixOutputs { found: usize },
    #[error("the prefix writes kv_cache {written} but the denoise graph reads {read}")]
    KvCache { written: String, read: String },
    #[error("the denoise graph takes no x_t / noise or no time_emb input")]
    NoNoiseOrTime,
    #[error("the denoise graph has {found} outputs, expected one")]
    DenoiseOutputs { found: usize },
    #[error("the denoise graph's output `{name}` does not have its input's size")]
    OutputSize { name: String },
    #[error("{graph}: the model has {inputs} inputs and {outputs} outputs, the manifest {planned_inputs} and {planned_outputs}: was the .om compiled from these graphs?")]
    ModelArity {
        graph: String,
        inputs: usize,
        outputs: usize,
        planned_inputs: usize,
        planned_outputs: usize,
    },
    #[error("{graph}: input {index} is `{model}` in the model, `{manifest}` in the manifest")]
    InputName {
        graph: String,
        index: usize,
        model: String,
        manifest: String,
    },
    #[error("{graph}: input {index} (`{name}`) takes {model} bytes in the model, {manifest} by the manifest ({spec})")]
    InputSize {
        graph: String,
        index: usize,
        name: String,
        model: usize,
        manifest: usize,
        spec: String,
    },
    #[error("{graph}: output {index} has {model} bytes in the model, {manifest} by the manifest")]
    OutputBytes {
        graph: String,
        index: usize,
        model: usize,
        manifest: usize,
    },
}

/// Bytes of a tensor from its manifest entry.
pub(crate) fn spec_bytes(s: &IoSpec) -> Result<usize, PlanError> {
    let size = match s.dtype.as_str() {
        "float32" | "int32" => 4,
        "float16" | "bfloat16" => 2,
        "int64" => 8,
        "uint8" | "bool" => 1,
        other => {
            return Err(PlanError::Dtype {
                name: s.name.clone(),
                dtype: other.into(),
            })
        }
    };
    Ok(s.shape.iter().product::<usize>() * size)
}

fn source_of(name: &str) -> Option<HostSource> {
    Some(match name {
        names::LANG_TOKENS => HostSource::Tokens,
        names::PREFIX_BIAS => HostSource::PrefixBias,
        names::PREFIX_COS => HostSource::PrefixCos,
        names::PREFIX_SIN => HostSource::PrefixSin,
        names::STATE => HostSource::State,
        names::X_T | names::NOISE => HostSource::Noise,
        names::TIME_EMB => HostSource::Time,
        names::SUFFIX_BIAS => HostSource::SuffixBias,
        names::SUFFIX_COS => HostSource::SuffixCos,
        names::SUFFIX_SIN => HostSource::SuffixSin,
        names::RTC_TARGET => HostSource::RtcTarget,
        names::RTC_WEIGHTS => HostSource::RtcWeights,
        names::RTC_GUIDANCE => HostSource::RtcGuidance,
        names::RTC_CLEAN => HostSource::RtcClean,
        names::RTC_CLEAN_VALUES => HostSource::RtcCleanValues,
        n => HostSource::Image(n.strip_prefix("image")?.parse().ok()?),
    })
}

/// What a denoise run binds to one of its inputs.
enum Feed {
    /// The same region every run (the KV cache, the tables).
    Fixed(Slot),
    /// This run's `x`: one of the two x buffers, alternating.
    X,
    /// This run's slice of the time embeddings.
    Time,
}

struct Planner {
    buffers: Vec<Buffer>,
    uploads: Vec<(HostSource, usize)>,
}

impl Planner {
    fn add(&mut self, name: &str, bytes: usize) -> usize {
        self.buffers.push(Buffer {
            name: name.into(),
            bytes,
        });
        self.buffers.len() - 1
    }

    fn whole(&self, buffer: usize) -> Slot {
        Slot {
            buffer,
            offset: 0,
            bytes: self.buffers[buffer].bytes,
        }
    }
}

pub(crate) fn plan(m: &Manifest) -> Result<BufferPlan, PlanError> {
    let mut p = Planner {
        buffers: Vec::new(),
        uploads: Vec::new(),
    };
    let mut prefix = Execution {
        inputs: Vec::new(),
        outputs: Vec::new(),
    };
    for s in &m.graphs.prefix.inputs {
        let source = source_of(&s.name).ok_or_else(|| PlanError::NotFed {
            graph: "prefix",
            name: s.name.clone(),
        })?;
        let b = p.add(&s.name, spec_bytes(s)?);
        p.uploads.push((source, b));
        prefix.inputs.push(p.whole(b));
    }
    let [kv_out] = m.graphs.prefix.outputs.as_slice() else {
        return Err(PlanError::PrefixOutputs {
            found: m.graphs.prefix.outputs.len(),
        });
    };
    let kv = p.add(&kv_out.name, spec_bytes(kv_out)?);
    prefix.outputs.push(p.whole(kv));

    let runs = if m.unrolled { 1 } else { m.steps };
    // Buffers of the denoise graph's inputs, in its order; `x` and time are filled per run.
    let mut x_in = None;
    let mut x_input = None;
    let mut time = None;
    let mut inputs = Vec::new();
    for (i, s) in m.graphs.denoise.inputs.iter().enumerate() {
        let bytes = spec_bytes(s)?;
        let slot = match s.name.as_str() {
            names::KV_CACHE => {
                if s != kv_out {
                    return Err(PlanError::KvCache {
                        written: format!("{:?} {}", kv_out.shape, kv_out.dtype),
                        read: format!("{:?} {}", s.shape, s.dtype),
                    });
                }
                Feed::Fixed(p.whole(kv))
            }
            names::X_T | names::NOISE => {
                let b = p.add(&s.name, bytes);
                p.uploads.push((HostSource::Noise, b));
                x_in = Some(b);
                x_input = Some(i);
                Feed::X
            }
            names::TIME_EMB => {
                let b = p.add(&s.name, bytes * runs);
                p.uploads.push((HostSource::Time, b));
                time = Some((b, bytes));
                Feed::Time
            }
            name => {
                let source = source_of(name).ok_or_else(|| PlanError::NotFed {
                    graph: "denoise",
                    name: name.into(),
                })?;
                let b = p.add(name, bytes);
                p.uploads.push((source, b));
                Feed::Fixed(p.whole(b))
            }
        };
        inputs.push(slot);
    }
    let (Some(x_a), Some(x_input), Some((time_buf, time_bytes))) = (x_in, x_input, time) else {
        return Err(PlanError::NoNoiseOrTime);
    };
    let [out] = m.graphs.denoise.outputs.as_slice() else {
        return Err(PlanError::DenoiseOutputs {
            found: m.graphs.denoise.outputs.len(),
        });
    };
    if spec_bytes(out)? != p.buffers[x_a].bytes {
        return Err(PlanError::OutputSize {
            name: out.name.clone(),
        });
    }
    // Looped steps alternate between two x buffers; the result is wherever the last run wrote.
    let x_b = p.add(&out.name, spec_bytes(out)?);
    let xs = [x_a, x_b];
    let mut denoise = Vec::with_capacity(runs);
    for run in 0..runs {
        let ins = inputs
            .iter()
            .map(|feed| match feed {
                Feed::X => p.whole(xs[run % 2]),
                Feed::Time => Slot {
                    buffer: time_buf,
                    offset: run * time_bytes,
                    bytes: time_bytes,
                },
                Feed::Fixed(slot) => *slot,
            })
            .collect();
        denoise.push(Execution {
            inputs: ins,
            outputs: vec![p.whole(xs[(run + 1) % 2])],
        });
    }
    let result = p.whole(xs[runs % 2]);
    Ok(BufferPlan {
        buffers: p.buffers,
        prefix,
        denoise,
        uploads: p.uploads,
        result,
        x_input,
    })
}

/// What a loaded offline model reports about its inputs and outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModelIo {
    /// `(name if reported, bytes)`.
    pub(crate) inputs: Vec<(Option<String>, usize)>,
    pub(crate) outputs: Vec<(Option<String>, usize)>,
}

/// Checks a loaded model against the plan (a .om compiled from other graphs is refused before
/// anything runs). ATC keeps input names; outputs are matched by size only.
pub(crate) fn check_model(
    graph: &str,
    io: &ModelIo,
    exec: &Execution,
    specs: &[IoSpec],
) -> Result<(), PlanError> {
    if io.inputs.len() != exec.inputs.len() || io.outputs.len() != exec.outputs.len() {
        return Err(PlanError::ModelArity {
            graph: graph.into(),
            inputs: io.inputs.len(),
            outputs: io.outputs.len(),
            planned_inputs: exec.inputs.len(),
            planned_outputs: exec.outputs.len(),
        });
    }
    for (i, ((name, bytes), (slot, spec))) in io
        .inputs
        .iter()
        .zip(exec.inputs.iter().zip(specs))
        .enumerate()
    {
        if let Some(n) = name {
            if n != &spec.name {
                return Err(PlanError::InputName {
                    graph: graph.into(),
                    index: i,
                    model: n.clone(),
                    manifest: spec.name.clone(),
                });
            }
        }
        if *bytes != slot.bytes {
            return Err(PlanError::InputSize {
                graph: graph.into(),
                index: i,
                name: spec.name.clone(),
                model: *bytes,
                manifest: slot.bytes,
                spec: format!("{:?} {}", spec.shape, spec.dtype),
            });
        }
    }
    for (i, ((_, bytes), slot)) in io.outputs.iter().zip(&exec.outputs).enumerate() {
        if *bytes != slot.bytes {
            return Err(PlanError::OutputBytes {
                graph: graph.into(),
                index: i,
                model: *bytes,
                manifest: slot.bytes,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::export::pi0::ExportDtype;
    use crate::policy::graph::manifest::{CheckpointInfo, GraphEntry, Graphs};

    fn spec(name: &str, dtype: &str, shape: &[usize]) -> IoSpec {
        IoSpec {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
        }
    }

    /// A manifest as `pi0d export` writes it for pi0 with `cameras` cameras, batch 1.
    pub(crate) fn manifest(cameras: usize, unrolled: bool, kv_dtype: &str) -> Manifest {
        let (p, n, hd, ew, l) = (cameras * 256 + 48, 51, 16, 32, 2);
        let mut prefix_inputs: Vec<IoSpec> = (0..cameras)
            .map(|i| spec(&format!("image{i}"), "float32", &[1, 3, 224, 224]))
            .collect();
        prefix_inputs.extend([
            spec("lang_tokens", "int64", &[1, 48]),
            spec("prefix_bias", "float32", &[1, 1, 1, p, p]),
            spec("prefix_cos", "float32", &[1, p, hd]),
            spec("prefix_sin", "float32", &[1, p, hd]),
        ]);
        let kv = spec("kv_cache", kv_dtype, &[l, 2, 1, p, hd]);
        let time = if unrolled {
            spec("time_emb", "float32", &[10, 1, ew])
        } else {
            spec("time_emb", "float32", &[1, ew])
        };
        let x = if unrolled { "noise" } else { "x_t" };
        let denoise_inputs = vec![
            kv.clone(),
            spec("state", "float32", &[1, 32]),
            spec(x, "float32", &[1, 50, 32]),
            time,
            spec("suffix_bias", "float32", &[1, 1, 1, n, p + n]),
            spec("suffix_cos", "float32", &[1, n, hd]),
            spec("suffix_sin", "float32", &[1, n, hd]),
        ];
        let out = if unrolled { "actions" } else { "x_next" };
        let entry = |file: &str, inputs, outputs| GraphEntry {
            file: file.into(),
            external_data: None,
            inputs,
            outputs,
            weight_bytes: 0,
            nodes: 0,
        };
        Manifest {
            format: crate::policy::graph::manifest::FORMAT.into(),
            producer: "test".into(),
            variant: "pi0".into(),
            dtype: ExportDtype::F32,
            opset: 13,
            batch: 1,
            cameras,
            prompt_len: 48,
            image_size: 224,
            tokens_per_image: 256,
            prefix_len: p,
            suffix_len: n,
            chunk: 50,
            action_dim: 32,
            state_dim: 32,
            steps: 10,
            dt: -0.1,
            layers: l,
            head_dim: hd,
            kv_dim: hd,
            expert_width: ew,
            vocab: 320,
            mask_value: -2.381_976_3e38,
            min_period: 4e-3,
            max_period: 4.0,
            unrolled,
            rtc: false,
            trained_rtc: None,
            quant: None,
            graphs: Graphs {
                prefix: entry("prefix.onnx", prefix_inputs, vec![kv]),
                denoise: entry(
                    if unrolled {
                        "denoise_unrolled.onnx"
                    } else {
                        "denoise_step.onnx"
                    },
                    denoise_inputs,
                    vec![spec(out, "float32", &[1, 50, 32])],
                ),
            },
            checkpoint: CheckpointInfo {
                path: "ck".into(),
                sha256: String::new(),
            },
        }
    }

    #[test]
    fn kv_cache_is_one_buffer_written_by_prefix_and_read_by_every_step() {
        let m = manifest(2, false, "float16");
        let plan = plan(&m).unwrap();
        let kv = plan.prefix.outputs[0];
        assert_eq!(plan.buffers[kv.buffer].name, "kv_cache");
        // f16 KV: layers x 2 x batch x prefix x kv_dim x 2 bytes.
        assert_eq!(kv.bytes, 2 * 2 * 560 * 16 * 2);
        assert_eq!(plan.denoise.len(), 10);
        assert!(plan.denoise.iter().all(|e| e.inputs[0] == kv));
        // Nothing else is planned for the KV cache.
        assert_eq!(
            plan.buffers.iter().filter(|b| b.name == "kv_cache").count(),
            1
        );
    }

    #[test]
    fn looped_steps_chain_x_on_the_device_and_read_their_own_time_row() {
        let plan = plan(&manifest(1, false, "float32")).unwrap();
        let x_bytes = 50 * 32 * 4;
        for (k, e) in plan.denoise.iter().enumerate() {
            let (x_in, time, x_out) = (e.inputs[2], e.inputs[3], e.outputs[0]);
            assert_eq!((x_in.bytes, x_out.bytes), (x_bytes, x_bytes));
            assert_ne!(x_in.buffer, x_out.buffer);
            assert_eq!(time.offset, k * 32 * 4);
            assert_eq!(time.bytes, 32 * 4);
            if k > 0 {
                // Step k reads what step k-1 wrote.
                assert_eq!(x_in.buffer, plan.denoise[k - 1].outputs[0].buffer);
            }
        }
        assert_eq!(plan.result, plan.denoise[9].outputs[0]);
        let time_buffer = plan.denoise[0].inputs[3].buffer;
        assert_eq!(plan.buffers[time_buffer].bytes, 10 * 32 * 4);
        // Uploads: every input once per observation, x only as the initial noise.
        let sources: Vec<HostSource> = plan.uploads.iter().map(|u| u.0).collect();
        assert_eq!(
            sources.iter().filter(|s| **s == HostSource::Noise).count(),
            1
        );
        assert!(sources.contains(&HostSource::Image(0)));
        assert!(sources.contains(&HostSource::State));
    }

    #[test]
    fn a_guided_step_writes_its_x_where_that_run_reads_it() {
        let plan = plan(&manifest(1, false, "float32")).unwrap();
        assert_eq!(plan.x_input, 2);
        for (k, e) in plan.denoise.iter().enumerate().skip(1) {
            // Run k reads the buffer run k-1 wrote: the host's guided x replaces it.
            assert_eq!(e.inputs[plan.x_input], plan.denoise[k - 1].outputs[0]);
        }
    }

    #[test]
    fn unrolled_graph_runs_once_noise_to_actions() {
        let plan = plan(&manifest(3, true, "float32")).unwrap();
        assert_eq!(plan.denoise.len(), 1);
        let e = &plan.denoise[0];
        assert_eq!(e.inputs[3].bytes, 10 * 32 * 4);
        assert_eq!(plan.result, e.outputs[0]);
        assert_ne!(e.inputs[2].buffer, e.outputs[0].buffer);
        assert_eq!(
            plan.uploads
                .iter()
                .filter(|u| matches!(u.0, HostSource::Image(_)))
                .count(),
            3
        );
    }

    #[test]
    fn rtc_graph_uploads_its_guidance_tables_once_per_observation() {
        let mut m = manifest(1, true, "float32");
        m.rtc = true;
        m.graphs.denoise.inputs.extend([
            spec("rtc_target", "float32", &[1, 50, 32]),
            spec("rtc_weights", "float32", &[1, 50, 1]),
            spec("rtc_guidance", "float32", &[10]),
        ]);
        let plan = plan(&m).unwrap();
        let e = &plan.denoise[0];
        assert_eq!(e.inputs.len(), 10);
        let sizes: Vec<usize> = e.inputs[7..].iter().map(|s| s.bytes).collect();
        assert_eq!(sizes, [50 * 32 * 4, 50 * 4, 10 * 4]);
        for source in [
            HostSource::RtcTarget,
            HostSource::RtcWeights,
            HostSource::RtcGuidance,
        ] {
            assert_eq!(plan.uploads.iter().filter(|u| u.0 == source).count(), 1);
        }
    }

    #[test]
    fn trained_rtc_graph_uploads_its_clamp_tables_once_per_observation() {
        let mut m = manifest(1, true, "float32");
        m.trained_rtc = Some(8);
        m.graphs.denoise.inputs.extend([
            spec("rtc_clean", "float32", &[1, 50, 1]),
            spec("rtc_clean_values", "float32", &[1, 50, 32]),
        ]);
        let plan = plan(&m).unwrap();
        let e = &plan.denoise[0];
        let sizes: Vec<usize> = e.inputs[7..].iter().map(|s| s.bytes).collect();
        assert_eq!(sizes, [50 * 4, 50 * 32 * 4]);
        for source in [HostSource::RtcClean, HostSource::RtcCleanValues] {
            assert_eq!(plan.uploads.iter().filter(|u| u.0 == source).count(), 1);
        }
    }

    #[test]
    fn mismatched_kv_or_model_is_refused_with_what_differs() {
        let mut m = manifest(1, false, "float32");
        m.graphs.denoise.inputs[0].dtype = "float16".into();
        let err = plan(&m).unwrap_err().to_string();
        assert!(err.contains("kv_cache") && err.contains("float16"), "{err}");

        let m = manifest(1, false, "float32");
        let plan = plan(&m).unwrap();
        let io = |sizes: &[usize], names: &[&str]| ModelIo {
            inputs: sizes
                .iter()
                .zip(names)
                .map(|(s, n)| (Some(n.to_string()), *s))
                .collect(),
            outputs: vec![(None, plan.prefix.outputs[0].bytes)],
        };
        let specs = &m.graphs.prefix.inputs;
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let sizes: Vec<usize> = plan.prefix.inputs.iter().map(|s| s.bytes).collect();
        check_model("prefix.om", &io(&sizes, &names), &plan.prefix, specs).unwrap();
        let mut wrong = sizes.clone();
        wrong[1] /= 2;
        let err = check_model("prefix.om", &io(&wrong, &names), &plan.prefix, specs)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("input 1 (`lang_tokens`) takes 192 bytes in the model, 384"),
            "{err}"
        );
        let mut renamed = names.clone();
        renamed[0] = "pixels";
        let err = check_model("prefix.om", &io(&sizes, &renamed), &plan.prefix, specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`pixels` in the model, `image0`"), "{err}");
        let err = check_model("prefix.om", &io(&sizes[..2], &names), &plan.prefix, specs)
            .unwrap_err()
            .to_string();
        assert!(err.contains("2 inputs"), "{err}");
    }
}
