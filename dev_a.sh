set -e; R=$(pwd)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
mkdir -p /tmp/b && tar -xJf build/carry/moex.tar.xz -C /tmp/b
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json LD_LIBRARY_PATH=/tmp/b
sh bench/gpu/session.sh /tmp/b gen > /dev/null
export MOEX_BENCH_TCP=1
for e in 4 1000000 4 1000000; do
  echo "each_rows $e $(MOEX_WORKER_EACH_ROWS=$e sh bench/gpu/session.sh /tmp/b distvk 2>&1 | grep '^dist_vk \|^dist_local ' | tr '\n' ' ')"
done
for e in 4 1000000; do
MOEX_WORKER_EACH_ROWS=$e MOEX_API_STREAMS=1,8 MOEX_API_REPS=2 sh bench/gpu/session.sh /tmp/b apidistonly > /dev/null 2>&1 || true
echo "api each_rows $e $(date -u +%H:%MZ)"; grep "^| [0-9]" $OUT/api_dist.md
done
