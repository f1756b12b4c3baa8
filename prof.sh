set -e
REPO=$(pwd)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
mkdir -p /tmp/b && tar -xJf build/carry/moex.tar.xz -C /tmp/b
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json LD_LIBRARY_PATH=/tmp/b
sh bench/gpu/session.sh /tmp/b gen > /dev/null 2>&1 || true
cd /tmp/b; M=/tmp/q30.gguf
./test_vk_ops router 2>&1 | tail -2; ./test_vk_ops fused 2>&1 | tail -1
for r in 1 2; do
 for b in bench_vk_prev bench_vk; do
  echo "$b p512: $(./$b $M --no-kernels -p 512 -n 32 -r 3 2>&1 | grep -E '^pp|^tg_after|fnv' | tr '\n' ' ')"
  echo "$b p32: $(./$b $M --no-kernels -p 32 -n 32 -r 5 2>&1 | grep -E '^pp' | tr '\n' ' ')"
 done
done
MOEX_VK_PROFILE=1 ./bench_vk $M --no-kernels -p 512 -n 4 -r 1 2>&1 | grep -E "ffn_norm_router|recording" | head -8
MOEX_VK_PROFILE=1 ./bench_vk $M --no-kernels -p 32 -n 4 -r 1 2>&1 | grep -E "ffn_norm_router|recording" | head -8
timeout 100 ./test_vk_batch $M 2>&1 | grep -E "slots|FAIL" | head -8
cd "$REPO"
MOEX_API_REPS=3 sh bench/gpu/session.sh /tmp/b apilocal
cp /tmp/moex-gpu/api_local.md $OUT/
