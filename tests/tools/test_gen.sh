#!/bin/sh
# Tests of `moex-gguf gen`.
#   test_gen.sh GROUP MOEX_GGUF TEST_GEN_CHECK FIXTURES WORKDIR
# GROUP: models       every arch x several types (and random-block weights):
#                     tensors, shapes, types, hparams, tokenizer, weight stats
#        determinism  same seed -> same bytes whatever the thread count; other seed -> other bytes
#        usage        bad flags and inputs: clear message, exit 2 (usage) or 1
set -u
group=$1 gguf=$2 check=$3 fixtures=$4 work=$5
vocab=$fixtures/vocab/ggml-vocab-llama-spm.gguf
mkdir -p "$work"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The test preset, as the task defines it (kept here, apart from the generator).
test_dims="--layers 2 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --ff 512 --experts 8 --experts-used 2 --expert-ff 256"

# gen_and_check ARCH TYPE [extra gen flags...]: generate, then verify with --stats.
gen_and_check() {
    arch=$1 type=$2
    shift 2
    out=$work/${arch}_${type}.gguf
    if ! "$gguf" gen --arch "$arch" --preset test --vocab "$vocab" --type "$type" --seed 3 -o "$out" --quiet "$@"; then
        fail "gen $arch $type $*"
        return
    fi
    tied=
    for f in "$@"; do [ "$f" = --tied ] && tied=--tied; done
    # shellcheck disable=SC2086
    "$check" "$out" --arch "$arch" --type "$type" $test_dims --vocab-size 32000 $tied --stats \
        || fail "check $arch $type $*"
    rm -f "$out"
}

case $group in
models)
    # Quantizing drawn floats (the small-model path; the K-quants' reference
    # quantizer is slow, so they come through mixed, which has every type once).
    gen_and_check qwen3moe f32
    gen_and_check qwen3 f16
    gen_and_check llama bf16
    gen_and_check mixtral q8_0
    gen_and_check qwen3moe q4_0
    gen_and_check qwen3 q4_1
    gen_and_check llama q5_0
    gen_and_check mixtral q5_1
    gen_and_check qwen3moe mxfp4
    for a in qwen3moe qwen3 llama mixtral; do gen_and_check $a mixed; done
    # Random quantized blocks (the fast path for big models).
    gen_and_check qwen3moe mixed --weights blocks
    gen_and_check qwen3moe q4_K_M --weights blocks
    gen_and_check mixtral q4_K_M --weights blocks
    gen_and_check llama q4_K --weights blocks
    gen_and_check qwen3 q5_K --weights blocks
    gen_and_check llama q6_K --weights blocks
    gen_and_check mixtral mxfp4 --weights blocks
    gen_and_check qwen3moe mxfp4_moe --weights blocks
    gen_and_check mixtral mxfp4_moe
    gen_and_check qwen3 q8_0 --tied
    # Rows that a type's block does not divide fall back as llama.cpp does:
    # hidden 288 = 9 x 32: q4_K -> q5_0; ffn_down's rows of 272 (not even a
    # multiple of 32): q6_K -> q8_0 does not fit either -> f16.
    test_dims_saved=$test_dims
    test_dims="--layers 2 --hidden 288 --heads 4 --kv-heads 2 --head-dim 64 --ff 512 --experts 8 --experts-used 2 --expert-ff 256"
    gen_and_check qwen3moe q4_K --hidden 288 --weights blocks
    test_dims="--layers 2 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --ff 272 --experts 8 --experts-used 2 --expert-ff 256"
    gen_and_check llama q6_K --ff 272 --weights blocks
    test_dims=$test_dims_saved
    ;;
determinism)
    a=$work/a.gguf b=$work/b.gguf
    for mode in float blocks; do
        "$gguf" gen --arch qwen3moe --preset test --vocab "$vocab" --type mixed --tied --seed 5 --weights $mode --threads 1 -o "$a" --quiet \
            && "$gguf" gen --arch qwen3moe --preset test --vocab "$vocab" --type mixed --tied --seed 5 --weights $mode --threads 2 -o "$b" --quiet \
            || fail "gen ($mode)"
        cmp -s "$a" "$b" || fail "$mode: same seed, different bytes with 1 and 2 threads"
        "$gguf" gen --arch qwen3moe --preset test --vocab "$vocab" --type mixed --tied --seed 6 --weights $mode -o "$b" --quiet || fail "gen seed 6"
        size=$(wc -c < "$a")
        [ "$(wc -c < "$b")" = "$size" ] || fail "$mode: seeds 5 and 6 gave files of different sizes"
        # Other weights, not just another name: most bytes must differ.
        differ=$(cmp -l "$a" "$b" | wc -l)
        [ "$differ" -gt $((size / 2)) ] || fail "$mode: seeds 5 and 6 differ in only $differ of $size bytes"
    done
    [ -e "$a.partial" ] && fail "a .partial file was left behind"
    rm -f "$a" "$b"
    ;;
usage)
    out=$work/u.gguf
    # expect CODE MESSAGE-FRAGMENT gen-args...
    expect() {
        code=$1 msg=$2
        shift 2
        err=$("$gguf" gen "$@" 2>&1 >/dev/null)
        rc=$?
        [ $rc -eq "$code" ] || fail "gen $*: exit $rc, want $code ($err)"
        case $err in *"$msg"*) ;; *) fail "gen $*: message '$err' lacks '$msg'" ;; esac
        [ -e "$out" ] && fail "gen $*: wrote $out despite the error" && rm -f "$out"
    }
    base="--preset test --vocab $vocab -o $out"
    # shellcheck disable=SC2086
    {
        expect 2 "unknown --arch" --arch gpt2 $base
        expect 2 "unknown preset" --arch llama --preset huge --vocab "$vocab" -o "$out"
        expect 2 "needs --arch" $base
        expect 2 "unknown --type" --arch llama $base --type q3_K
        expect 2 "unknown --type" --arch llama $base --type q8_K
        expect 2 "whole number" --arch llama $base --layers 0
        expect 2 "whole number" --arch llama $base --hidden 12x
        expect 2 "whole number" --arch llama $base --heads -4
        expect 2 "multiple of --kv-heads" --arch llama $base --heads 4 --kv-heads 3
        expect 2 "--experts-used exceeds" --arch qwen3moe $base --experts 2 --experts-used 3
        expect 2 "needs --experts" --arch qwen3moe --preset llama-1b --vocab "$vocab" -o "$out"
        expect 2 "non-negative integer" --arch llama $base --seed -1
        expect 2 "unknown option" --arch llama $base --bogus
        expect 2 "needs a value" --arch llama $base --type
        expect 2 "required" --arch llama --preset test --vocab "$vocab"
        expect 2 "--weights" --arch llama $base --weights fast
        expect 2 "positive number" --arch llama $base --rope-base 0
        expect 1 "cannot" --arch llama --preset test --vocab "$work/no-such.gguf" -o "$out"
        expect 1 "cannot create" --arch llama --preset test --vocab "$vocab" -o "$work/no/such/dir/m.gguf"
    }
    # A file that is not GGUF, and a GGUF without a tokenizer, as the vocab.
    printf 'not a gguf file at all' > "$work/junk.gguf"
    expect 1 "" --arch llama --preset test --vocab "$work/junk.gguf" -o "$out"
    "$gguf" gen --arch llama --preset test --vocab "$vocab" --type f32 --layers 1 -o "$work/m.gguf" --quiet || fail "gen m"
    "$gguf" gen --help | grep -q "qwen3-30b-a3b" || fail "gen --help does not list the presets"
    # Refusal when the disk is too small: a ~400 TB model is refused up front, nothing written.
    expect 1 "are free" --preset qwen3-30b-a3b --vocab "$vocab" --type f32 --layers 512 --experts 512 \
        --expert-ff 65536 -o "$out"
    [ -e "$out.partial" ] && fail "a .partial file was left after the refusal"
    rm -f "$work/junk.gguf" "$work/m.gguf"
    ;;
*)
    echo "test_gen.sh: unknown group '$group'" >&2
    exit 2
    ;;
esac

[ $fails -eq 0 ] && echo "test_gen $group: ok" && exit 0
echo "test_gen $group: $fails failure(s)"
exit 1
