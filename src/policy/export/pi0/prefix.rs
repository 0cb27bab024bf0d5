//! The prefix graph: images, prompt tokens and host-made tables -> the KV cache.

use super::super::builder::{attr_int, attr_ints, GraphBuilder};
use super::super::proto::data_type;
use super::*;

impl<'a> Pi0GraphBuilder<'a> {
    /// The prefix graph: images, tokens and tables -> KV cache.
    pub(crate) fn prefix_graph(&self) -> GraphBuilder<'a> {
        let a = &self.arch;
        let GraphSizes {
            batch: b,
            cameras,
            prompt_len,
        } = self.sizes;
        let ct = self.ct();
        let p = self.sizes.prefix_len(a);
        let (vw, side, patch) = (a.vision_width, a.image_size / a.patch, a.patch);
        let n = side * side;
        let kvd = a.kv_heads * a.head_dim;
        let mut g = GraphBuilder::new("pi0_prefix");
        let images: Vec<String> = (0..cameras)
            .map(|i| {
                g.input(
                    &names::image(i),
                    data_type::FLOAT,
                    &[b, 3, a.image_size, a.image_size],
                )
            })
            .collect();
        let tokens = g.input(names::LANG_TOKENS, data_type::INT64, &[b, prompt_len]);
        let bias = g.input(names::PREFIX_BIAS, data_type::FLOAT, &[b, 1, 1, p, p]);
        let cos = g.input(names::PREFIX_COS, data_type::FLOAT, &[b, p, a.head_dim]);
        let sin = g.input(names::PREFIX_SIN, data_type::FLOAT, &[b, p, a.head_dim]);

        // SigLIP over all cameras at once: [cameras*B, 3, S, S], camera-major.
        let refs: Vec<&str> = images.iter().map(String::as_str).collect();
        let all = if cameras > 1 {
            g.op("Concat", &refs, vec![attr_int("axis", 0)])
        } else {
            images[0].clone()
        };
        let all = Self::cast(&mut g, &all, data_type::FLOAT, ct);
        let pe = format!("{VISION}.embeddings.patch_embedding");
        let w = self.stored(
            &mut g,
            &format!("{pe}.weight"),
            &[vw, 3, patch, patch],
            self.tensor_src(format!("{pe}.weight"), vec![vw, 3, patch, patch]),
        );
        let pb = self.stored(
            &mut g,
            &format!("{pe}.bias"),
            &[vw],
            self.tensor_src(format!("{pe}.bias"), vec![vw]),
        );
        let conv = g.op(
            "Conv",
            &[&all, &w, &pb],
            vec![
                attr_ints("kernel_shape", &[patch as i64, patch as i64]),
                attr_ints("strides", &[patch as i64, patch as i64]),
            ],
        );
        let xb = cameras * b;
        let x = Self::reshape(&mut g, &conv, &[xb, vw, n]);
        let x = Self::transpose_op(&mut g, &x, &[0, 2, 1]);
        let pos_name = format!("{VISION}.embeddings.position_embedding.weight");
        let pos = self.stored(
            &mut g,
            &pos_name,
            &[n, vw],
            self.tensor_src(pos_name.clone(), vec![n, vw]),
        );
        let mut x = g.op("Add", &[&x, &pos], vec![]);
        let vh = a.vision_heads;
        for i in 0..a.vision_layers {
            let base = format!("{VISION}.encoder.layers.{i}");
            let h = self.layer_norm(&mut g, &x, &format!("{base}.layer_norm1"), vw);
            let qkv = self.linears(
                &mut g,
                &h,
                &[
                    (&format!("{base}.self_attn.q_proj"), vw),
                    (&format!("{base}.self_attn.k_proj"), vw),
                    (&format!("{base}.self_attn.v_proj"), vw),
                ],
                vw,
                true,
            );
            let att = self.attention(
                &mut g,
                &qkv[0],
                &qkv[1],
                &qkv[2],
                (xb, n, n),
                (vh, vh, vw / vh),
                None,
            );
            let o = self.linear(
                &mut g,
                &att,
                &format!("{base}.self_attn.out_proj"),
                vw,
                vw,
                true,
            );
            x = g.op("Add", &[&x, &o], vec![]);
            let h = self.layer_norm(&mut g, &x, &format!("{base}.layer_norm2"), vw);
            let m = self.linear(
                &mut g,
                &h,
                &format!("{base}.mlp.fc1"),
                a.vision_mlp,
                vw,
                true,
            );
            let m = self.gelu_tanh(&mut g, &m);
            let o = self.linear(
                &mut g,
                &m,
                &format!("{base}.mlp.fc2"),
                vw,
                a.vision_mlp,
                true,
            );
            x = g.op("Add", &[&x, &o], vec![]);
        }
        let h = self.layer_norm(&mut g, &x, &format!("{VISION}.post_layernorm"), vw);
        let img = self.linear(&mut g, &h, PROJECTOR, a.width, vw, true);
        let img = Self::reshape(&mut g, &img, &[cameras, b, n, a.width]);
        let img = Self::transpose_op(&mut g, &img, &[1, 0, 2, 3]);
        let img = Self::reshape(&mut g, &img, &[b, cameras * n, a.width]);

        // Text: the embedding pre-scaled by sqrt(width), rounded in its stored type as PyTorch
        // computes the product.
        let ck = self.ck;
        let (vocab, width) = (a.vocab, a.width);
        let embed = self.stored(
            &mut g,
            "embed_tokens.scaled",
            &[vocab, width],
            Box::new(move || {
                let names = [format!("{LM}.embed_tokens.weight"), LM_HEAD.to_string()];
                let t = ck.take(&[&names[0], &names[1]], &[vocab, width])?;
                let scale = t.dtype.round((width as f64).sqrt() as f32);
                Ok(t.data.iter().map(|e| t.dtype.round(e * scale)).collect())
            }),
        );
        let text = g.op("Gather", &[&embed, &tokens], vec![attr_int("axis", 0)]);
        let mut x = g.op("Concat", &[&img, &text], vec![attr_int("axis", 1)]);

        let rope = self.rope_tables(&mut g, &cos, &sin, p);
        let mut kv = Vec::new();
        for i in 0..a.layers {
            let base = format!("{LM}.layers.{i}");
            let last = i + 1 == a.layers;
            let (nx, k, v) = self.gemma_layer(
                &mut g,
                &base,
                &x,
                (a.width, a.mlp),
                &rope,
                &bias,
                None,
                None,
                last,
            );
            x = nx;
            kv.push(Self::reshape(&mut g, &k, &[1, b, p, kvd]));
            kv.push(Self::reshape(&mut g, &v, &[1, b, p, kvd]));
        }
        let refs: Vec<&str> = kv.iter().map(String::as_str).collect();
        let kv = g.op("Concat", &refs, vec![attr_int("axis", 0)]);
        let kv = Self::reshape(&mut g, &kv, &[a.layers, 2, b, p, kvd]);
        g.output(&kv, names::KV_CACHE, ct, &[a.layers, 2, b, p, kvd]);
        g
    }
}
