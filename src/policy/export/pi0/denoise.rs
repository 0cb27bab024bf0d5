//! The denoise graph: the KV cache, state, `x_t` and the step's tables -> `x_{t+dt}`, or every
//! step unrolled -> actions.

use super::super::builder::{attr_int, GraphBuilder};
use super::super::proto::data_type;
use super::*;
use crate::policy::pi0::ops::time_embedding;

impl<'a> Pi0GraphBuilder<'a> {
    /// The denoise graph: one Euler step, or all of them with `unroll` (and with `rtc`, each
    /// step guided by the inputs `rtc_*`; zero weights give the plain steps).
    pub(crate) fn denoise_graph(&self, unroll: bool, rtc: bool) -> GraphBuilder<'a> {
        let a = &self.arch;
        let b = self.sizes.batch;
        let ct = self.ct();
        let p = self.sizes.prefix_len(a);
        let n = suffix_len(a);
        let kvd = a.kv_heads * a.head_dim;
        let ew = a.expert_width;
        let mut g = GraphBuilder::new(if unroll {
            "pi0_denoise_unrolled"
        } else {
            "pi0_denoise_step"
        });
        let kv = g.input(names::KV_CACHE, ct, &[a.layers, 2, b, p, kvd]);
        let state = (a.variant == Variant::Pi0)
            .then(|| g.input(names::STATE, data_type::FLOAT, &[b, a.state_dim]));
        let x_in = g.input(
            if unroll { names::NOISE } else { names::X_T },
            data_type::FLOAT,
            &[b, a.chunk, a.action_dim],
        );
        let time = if unroll {
            g.input(names::TIME_EMB, data_type::FLOAT, &[a.steps, b, ew])
        } else {
            g.input(names::TIME_EMB, data_type::FLOAT, &[b, ew])
        };
        let bias = g.input(names::SUFFIX_BIAS, data_type::FLOAT, &[b, 1, 1, n, p + n]);
        let cos = g.input(names::SUFFIX_COS, data_type::FLOAT, &[b, n, a.head_dim]);
        let sin = g.input(names::SUFFIX_SIN, data_type::FLOAT, &[b, n, a.head_dim]);
        let rope = self.rope_tables(&mut g, &cos, &sin, n);
        let clean = self.trained_rtc.then(|| {
            let c = g.input(names::RTC_CLEAN, data_type::FLOAT, &[b, a.chunk, 1]);
            let one = g.scalar(1.0, data_type::FLOAT);
            let keep = g.op("Sub", &[&one, &c], vec![]);
            let values = unroll.then(|| {
                let v = g.input(
                    names::RTC_CLEAN_VALUES,
                    data_type::FLOAT,
                    &[b, a.chunk, a.action_dim],
                );
                (v, c.clone(), keep.clone())
            });
            Clean {
                clean: Self::cast(&mut g, &c, data_type::FLOAT, ct),
                keep: Self::cast(&mut g, &keep, data_type::FLOAT, ct),
                values,
            }
        });
        // The clamp, `x keep + values clean`: exact for selectors of 0 and 1.
        let clamp = |g: &mut GraphBuilder<'a>, x: &str| match clean
            .as_ref()
            .and_then(|c| c.values.as_ref())
        {
            Some((v, c, keep)) => {
                let kept = g.op("Mul", &[x, keep], vec![]);
                let set = g.op("Mul", &[v, c], vec![]);
                g.op("Add", &[&kept, &set], vec![])
            }
            None => x.to_string(),
        };
        let rtc = rtc.then(|| RtcInputs {
            target: g.input(
                names::RTC_TARGET,
                data_type::FLOAT,
                &[b, a.chunk, a.action_dim],
            ),
            weights: g.input(names::RTC_WEIGHTS, data_type::FLOAT, &[b, a.chunk, 1]),
            guidance: g.input(names::RTC_GUIDANCE, data_type::FLOAT, &[a.steps]),
        });

        // Per layer: the prefix's K and V, [B, P, kvd] (taken once, shared by every step).
        let mut cached = Vec::new();
        for i in 0..a.layers {
            let li = g.i64_scalar(i as i64);
            let layer = g.op("Gather", &[&kv, &li], vec![attr_int("axis", 0)]);
            let zero = g.i64_scalar(0);
            let one = g.i64_scalar(1);
            let k = g.op("Gather", &[&layer, &zero], vec![attr_int("axis", 0)]);
            let v = g.op("Gather", &[&layer, &one], vec![attr_int("axis", 0)]);
            cached.push((k, v));
        }
        // pi0's state token does not depend on the step.
        let state_token = state.map(|s| {
            let s = Self::cast(&mut g, &s, data_type::FLOAT, ct);
            let s = Self::reshape(&mut g, &s, &[b, 1, a.state_dim]);
            self.linear(&mut g, &s, "state_proj", ew, a.state_dim, true)
        });

        let dt = -1.0 / a.steps as f32;
        let mut x = x_in;
        let steps = if unroll { a.steps } else { 1 };
        for step in 0..steps {
            let t = if unroll {
                let k = g.i64_scalar(step as i64);
                g.op("Gather", &[&time, &k], vec![attr_int("axis", 0)])
            } else {
                time.clone()
            };
            let guide = rtc.as_ref().map(|r| {
                let k = g.i64_scalar(step as i64);
                let gk = g.op("Gather", &[&r.guidance, &k], vec![attr_int("axis", 0)]);
                (r, gk, 1.0 - step as f64 / a.steps as f64)
            });
            let xc = clamp(&mut g, &x);
            let next = self.step(
                &mut g,
                &xc,
                &t,
                state_token.as_deref(),
                &cached,
                &bias,
                &rope,
                dt,
                guide,
                clean.as_ref(),
            );
            x = clamp(&mut g, &next);
        }
        let out = if unroll {
            names::ACTIONS
        } else {
            names::X_NEXT
        };
        g.output(&x, out, data_type::FLOAT, &[b, a.chunk, a.action_dim]);
        g
    }

    /// One Euler step: `x_t` (f32) -> `x_t + dt * v(x_t, t)` (f32). With `guide` (the RTC
    /// inputs, this step's guidance weight and its flow time), `v` is guided first as
    /// `policy::rtc::Guidance::apply` does: `v - g * W (Y - (x_t - time v))`.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        g: &mut GraphBuilder<'a>,
        x_t: &str,
        time: &str,
        state_token: Option<&str>,
        cached: &[(String, String)],
        bias: &str,
        rope: &Rope,
        dt: f32,
        guide: Option<(&RtcInputs, String, f64)>,
        clean: Option<&Clean>,
    ) -> String {
        let a = &self.arch;
        let (b, ew, ct) = (self.sizes.batch, a.expert_width, self.ct());
        let p = self.sizes.prefix_len(a);
        let n = suffix_len(a);
        let xc = Self::cast(g, x_t, data_type::FLOAT, ct);
        let actions = self.linear(g, &xc, "action_in_proj", ew, a.action_dim, true);
        let t = Self::cast(g, time, data_type::FLOAT, ct);
        let t = Self::reshape(g, &t, &[b, 1, ew]);
        let mut mods: Vec<Option<[String; 6]>> = vec![None; a.layers];
        let mut final_norm = None;
        let x = match state_token {
            Some(st) => {
                // pi0: action_time_mlp_in(concat[actions, time]) as two matmuls; the time half
                // once per step, broadcast over the action tokens.
                let tin = self.time_in_name();
                let (wa, wt, bias_t) = self.split_time_in(g, &tin);
                let ap = g.op("MatMul", &[&actions, &wa], vec![]);
                let tp = g.op("MatMul", &[&t, &wt], vec![]);
                let tp = g.op("Add", &[&tp, &bias_t], vec![]);
                let m = g.op("Add", &[&ap, &tp], vec![]);
                let m = Self::silu(g, &m);
                let tout = self.time_out_name();
                let tokens = self.linear(g, &m, &tout, ew, ew, true);
                g.op("Concat", &[st, &tokens], vec![attr_int("axis", 1)])
            }
            None => {
                // pi0.5: the time conditions every expert norm; with training-time RTC the
                // clamped tokens' norms take the condition of time 0 (a constant).
                let cond = |g: &mut GraphBuilder<'a>, t: &str| {
                    let c = self.linear(g, t, "time_mlp_in", ew, ew, true);
                    let c = Self::silu(g, &c);
                    let c = self.linear(g, &c, "time_mlp_out", ew, ew, true);
                    Self::silu(g, &c)
                };
                let c = cond(g, &t);
                let c0 = clean.map(|_| {
                    let mut emb = vec![0.0f32; ew];
                    time_embedding(
                        0.0,
                        self.ck.config.min_period,
                        self.ck.config.max_period,
                        &mut emb,
                    );
                    let t0 = g.floats(&emb, &[1, 1, ew]);
                    let t0 = Self::cast(g, &t0, data_type::FLOAT, ct);
                    cond(g, &t0)
                });
                let modulation = |g: &mut GraphBuilder<'a>, base: &str| {
                    let split3 = |g: &mut GraphBuilder<'a>, c: &str| {
                        let parts =
                            self.linears(g, c, &[(&format!("{base}.dense"), 3 * ew)], ew, true);
                        let split = g.i64s(&[ew as i64, ew as i64, ew as i64]);
                        g.op_n("Split", &[&parts[0], &split], 3, vec![attr_int("axis", -1)])
                    };
                    let at_t = split3(g, &c);
                    match (clean, c0.as_deref()) {
                        (Some(cl), Some(c0)) => {
                            // Per token: t's where kept, time 0's where clamped (exact for
                            // selectors of 0 and 1).
                            let at_0 = split3(g, c0);
                            at_t.iter()
                                .zip(&at_0)
                                .map(|(a, z)| {
                                    let a = g.op("Mul", &[a, &cl.keep], vec![]);
                                    let z = g.op("Mul", &[z, &cl.clean], vec![]);
                                    g.op("Add", &[&a, &z], vec![])
                                })
                                .collect()
                        }
                        _ => at_t,
                    }
                };
                for (i, m) in mods.iter_mut().enumerate() {
                    let base = format!("{EXPERT}.layers.{i}");
                    let inp = modulation(g, &format!("{base}.input_layernorm"));
                    let post = modulation(g, &format!("{base}.post_attention_layernorm"));
                    *m = Some([
                        inp[0].clone(),
                        inp[1].clone(),
                        inp[2].clone(),
                        post[0].clone(),
                        post[1].clone(),
                        post[2].clone(),
                    ]);
                }
                let f = modulation(g, &format!("{EXPERT}.norm"));
                final_norm = Some(NormKind::Adaptive(f[0].clone(), f[1].clone()));
                actions
            }
        };
        let mut x = x;
        for (i, (kp, vp)) in cached.iter().enumerate() {
            let base = format!("{EXPERT}.layers.{i}");
            let (nx, _, _) = self.gemma_layer(
                g,
                &base,
                &x,
                (ew, a.expert_mlp),
                rope,
                bias,
                Some((kp, vp, p)),
                mods[i].as_ref(),
                false,
            );
            x = nx;
        }
        let norm = final_norm.unwrap_or_else(|| self.rms_weight(g, &format!("{EXPERT}.norm"), ew));
        g.probe(&x, Some(Group::Expert), ProbeKind::Stream);
        let x = self.rms_norm(g, &x, &norm);
        let x = if n > a.chunk {
            let starts = g.i64s(&[(n - a.chunk) as i64]);
            let ends = g.i64s(&[n as i64]);
            let axes = g.i64s(&[1]);
            g.op("Slice", &[&x, &starts, &ends, &axes], vec![])
        } else {
            x
        };
        let v = self.linear(g, &x, "action_out_proj", a.action_dim, ew, true);
        let v = Self::cast(g, &v, ct, data_type::FLOAT);
        let v = match guide {
            Some((r, gk, flow_time)) => {
                let t = g.scalar(flow_time as f32, data_type::FLOAT);
                let tv = g.op("Mul", &[&v, &t], vec![]);
                let x1 = g.op("Sub", &[x_t, &tv], vec![]);
                let e = g.op("Sub", &[&r.target, &x1], vec![]);
                let e = g.op("Mul", &[&e, &r.weights], vec![]);
                let ge = g.op("Mul", &[&e, &gk], vec![]);
                g.op("Sub", &[&v, &ge], vec![])
            }
            None => v,
        };
        let dt = g.scalar(dt, data_type::FLOAT);
        let dv = g.op("Mul", &[&v, &dt], vec![]);
        g.op("Add", &[x_t, &dv], vec![])
    }

    fn time_in_name(&self) -> String {
        if self.ck.contains("action_time_mlp_in.weight") {
            "action_time_mlp_in".into()
        } else {
            "time_mlp_in".into()
        }
    }

    fn time_out_name(&self) -> String {
        if self.ck.contains("action_time_mlp_out.weight") {
            "action_time_mlp_out".into()
        } else {
            "time_mlp_out".into()
        }
    }

    /// pi0's `action_time_mlp_in` (`[ew, 2ew]`) split into its action and time halves
    /// (`[ew, ew]` each, transposed) and its bias.
    fn split_time_in(&self, g: &mut GraphBuilder<'a>, base: &str) -> (String, String, String) {
        let ew = self.arch.expert_width;
        let ck = self.ck;
        let half = |g: &mut GraphBuilder<'a>, which: usize| {
            let name = format!("{base}.weight");
            self.stored(
                g,
                &format!("{base}.weight.{}", ["action", "time"][which]),
                &[ew, ew],
                Box::new(move || {
                    let t = super::qlinear::dense(ck, &name, ew, 2 * ew)?;
                    let mut out = vec![0.0f32; ew * ew];
                    for o in 0..ew {
                        for i in 0..ew {
                            out[i * ew + o] = t[o * 2 * ew + which * ew + i];
                        }
                    }
                    Ok(out)
                }),
            )
        };
        let wa = half(g, 0);
        let wt = half(g, 1);
        let b = self.stored(
            g,
            &format!("{base}.bias"),
            &[ew],
            self.tensor_src(format!("{base}.bias"), vec![ew]),
        );
        (wa, wt, b)
    }
}
