# Dev tool: random-weight F32 GGUF models in the scheme of ../shared/reference/README.md
# (weights N(0, std^2) with the README's scales; norms 1 + N(0, 0.1^2)), tokenizer keys
# copied from the reference model files.
import os, sys, numpy as np
XC = os.environ['XC']
sys.path.insert(0, os.environ['GGUF_PY'])
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType
REF = os.environ['SHARED'] + '/reference/models/'
def tok_fields(path):
    r = GGUFReader(path)
    out = []
    for k, f in r.fields.items():
        if k.startswith('tokenizer.'):
            sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
            out.append((k, f.contents(), f.types[0], sub))
    return out
VOCAB = {'spm': tok_fields(REF + 'ref-llama-f16.gguf'), 'qwen': tok_fields(REF + 'ref-qwen3moe-f16.gguf')}

def make(name, arch, vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, base, eps, ctx,
         tied=True, bias=False, qknorm=False, moe=None, yarn=None, seed=0, scales=None):
    rng = np.random.Generator(np.random.PCG64(seed))
    w = GGUFWriter(f'{XC}/models/{name}-f32.gguf', arch)
    w.add_context_length(ctx); w.add_embedding_length(n_embd); w.add_block_count(n_layer)
    w.add_head_count(n_head); w.add_head_count_kv(n_head_kv); w.add_key_length(head_dim); w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim); w.add_rope_freq_base(base); w.add_layer_norm_rms_eps(eps)
    nv = len(VOCAB[vocab][[k for k, *_ in VOCAB[vocab]].index('tokenizer.ggml.tokens')][1])
    w.add_vocab_size(nv)
    if moe:
        ne, nu, nffe = moe
        w.add_feed_forward_length(nffe * nu); w.add_expert_count(ne); w.add_expert_used_count(nu)
        w.add_expert_feed_forward_length(nffe)
    else:
        w.add_feed_forward_length(n_ff)
    if yarn:
        factor, orig = yarn
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN); w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(orig)
    w.add_file_type(0)
    for k, v, t, sub in VOCAB[vocab]:
        w.add_key_value(k, v, t, sub_type=sub)
    s = scales
    def T(tname, shape, std):  # shape in numpy order (rows, cols)
        w.add_tensor(tname, (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32))
    def N(tname, n):
        w.add_tensor(tname, (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32))
    T('token_embd.weight', (nv, n_embd), s['emb'])
    for l in range(n_layer):
        p = f'blk.{l}.'
        N(p + 'attn_norm.weight', n_embd)
        T(p + 'attn_q.weight', (n_head * head_dim, n_embd), s['qk'] / np.sqrt(n_embd))
        T(p + 'attn_k.weight', (n_head_kv * head_dim, n_embd), s['qk'] / np.sqrt(n_embd))
        T(p + 'attn_v.weight', (n_head_kv * head_dim, n_embd), 1 / np.sqrt(n_embd))
        if bias:
            T(p + 'attn_q.bias', (n_head * head_dim,), 0.5); T(p + 'attn_k.bias', (n_head_kv * head_dim,), 0.5)
            T(p + 'attn_v.bias', (n_head_kv * head_dim,), 0.5)
        if qknorm:
            N(p + 'attn_q_norm.weight', head_dim); N(p + 'attn_k_norm.weight', head_dim)
        T(p + 'attn_output.weight', (n_embd, n_head * head_dim), s['o'] / np.sqrt(n_head * head_dim))
        N(p + 'ffn_norm.weight', n_embd)
        if moe:
            ne, nu, nffe = moe
            T(p + 'ffn_gate_inp.weight', (ne, n_embd), 2.0 / np.sqrt(n_embd))
            T(p + 'ffn_gate_exps.weight', (ne, nffe, n_embd), 1 / np.sqrt(n_embd))
            T(p + 'ffn_up_exps.weight', (ne, nffe, n_embd), 1 / np.sqrt(n_embd))
            T(p + 'ffn_down_exps.weight', (ne, n_embd, nffe), s['down'] / np.sqrt(nffe))
        else:
            T(p + 'ffn_gate.weight', (n_ff, n_embd), 1 / np.sqrt(n_embd))
            T(p + 'ffn_up.weight', (n_ff, n_embd), 1 / np.sqrt(n_embd))
            T(p + 'ffn_down.weight', (n_embd, n_ff), s['down'] / np.sqrt(n_ff))
    N('output_norm.weight', n_embd)
    if not tied:
        T('output.weight', (nv, n_embd), s['emb'])
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    print(name)

LL = dict(emb=0.25, qk=1.5, o=2.5, down=2.5)
MO = dict(emb=0.5, qk=1.0, o=6.0, down=6.0)
which = sys.argv[1:]
def want(n): return not which or n in which
if want('xq2'): make('xq2', 'qwen2', 'qwen', 256, 2, 8, 2, 32, 512, 1e6, 1e-6, 32768, tied=False, bias=True, seed=11, scales=LL)
if want('xq3'): make('xq3', 'qwen3', 'qwen', 256, 2, 8, 4, 64, 512, 1e6, 1e-6, 40960, tied=True, qknorm=True, seed=12, scales=LL)
if want('xq3y'): make('xq3y', 'qwen3', 'qwen', 256, 2, 8, 4, 64, 512, 1e6, 1e-6, 4096, tied=True, qknorm=True, yarn=(4.0, 1024), seed=13, scales=LL)
if want('xmoe'): make('xmoe', 'qwen3moe', 'qwen', 256, 2, 4, 2, 64, 0, 1e6, 1e-6, 262144, tied=True, qknorm=True, moe=(8, 2, 256), seed=14, scales=MO)
if want('xll'): make('xll', 'llama', 'spm', 256, 2, 8, 4, 32, 768, 10000, 1e-5, 32768, tied=False, seed=15, scales=LL)
