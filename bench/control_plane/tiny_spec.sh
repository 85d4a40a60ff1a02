# Sourced by the control-plane benchmarks: tiny_spec DIR NAME STEPS [EXTRA]
# writes DIR/NAME.yaml, the integration tests' tiny 2-rank CPU job (tiny
# preset, train_law.txt, seq 32, global batch 8, tuning off; EXTRA adds
# resources fields, e.g. ", launcher: slurm, slurm: {nodes: 1}") and prints
# its path. Needs DATA (the shared data folder).
tiny_spec() {
  cat > "$1/$2.yaml" <<YAML
name: $2
model: {preset: tiny}
data:
  train: $DATA/ecspell/train_law.txt
  eval: $DATA/ecspell/test_law.txt
  max_seq_len: 32
train:
  steps: $3
  global_batch: 8
  eval_every: 0
  checkpoint_every: 0
  optimizer: {lr: 1.0e-3}
resources: {ranks: 2, device: cpu, threads_per_rank: 1${4:-}}
tuning: {mode: off}
YAML
  echo "$1/$2.yaml"
}
