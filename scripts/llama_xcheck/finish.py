# Adds to each vectors/*.json the fields tests/runtime/model_reference_test.cc checks
# (file size and sha256, n_embd, n_layer, tied output, KV types).
import sys, json, glob, hashlib, os
XC = os.environ['XC']
sys.path.insert(0, os.environ['GGUF_PY'])
from gguf import GGUFReader
for v in sorted(glob.glob(XC + '/vectors/*.json')):
    try: d = json.load(open(v))
    except Exception: continue
    if 'file_sha256' in d['model']: continue
    f = XC + '/models/' + os.path.basename(v)[:-5] + '.gguf'
    r = GGUFReader(f)
    arch = str(bytes(r.fields['general.architecture'].parts[-1]), 'utf-8')
    g = lambda k: int(r.fields[arch + '.' + k].parts[-1][0])
    d['model'].update(file=os.path.basename(f), file_size=os.path.getsize(f),
        file_sha256=hashlib.sha256(open(f,'rb').read()).hexdigest(), arch=arch,
        n_embd=g('embedding_length'), n_layer=g('block_count'),
        tied_embeddings=not any(t.name == 'output.weight' for t in r.tensors))
    d['reference'].update(type_k='f16', type_v='f16')
    json.dump(d, open(v, 'w'))
    print('finished', v)
