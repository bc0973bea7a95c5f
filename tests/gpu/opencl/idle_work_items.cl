// The GPU schedule's PoCL anomaly, reduced (docs/gpu-check.md): the shape of
// Halide's attention kernel with a key tile wider than the threads that stage V, cut down to what
// still goes wrong. Race-free, every barrier reached by the whole work-group: each work-item in
// the first 16 columns must return keys * value. PoCL 3.1 (LLVM 15) loses the staging's stores
// in a work-group with idle work-items (wider than 16 here, or taller with the guards on y), in
// both of its work-group methods (loopvec, loops): the sums are of what the local memory held
// before (zeros in a fresh process, a previous launch's values after one). Right with
// -cl-opt-disable and in a 16 x 16 group, and right again after any one of these changes: a
// staging trip count that does not depend on the work-item, the store before the first barrier
// made by every work-item or into another local array, a tile loop of one constant iteration.
__kernel void staged_row_sums(__global int *sums, int keys, int value) {
    __local int tile_and_scratch[4096];  // rows of 64: a tile of up to 32 rows, then scratch
    const int x = get_local_id(0), y = get_local_id(1);
    int sum = 0;
    for (int tile_start = 0; tile_start < keys; tile_start += 32) {
        const int rows = min(keys - tile_start, 32);
        if (x < 16) tile_and_scratch[3072 + y * 16 + x] = 0;  // another stage's output
        barrier(CLK_LOCAL_MEM_FENCE);
        if (x < 16)  // stage the tile: work-item (x, y) writes rows y, y + 16 of column x
            for (int strip = 0; strip < (rows - y + 15) / 16; ++strip)
                tile_and_scratch[(strip * 16 + y) * 64 + x] = value;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (x < 16)  // read the column the other work-items staged
            for (int row = 0; row < rows; ++row) sum += tile_and_scratch[row * 64 + x];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (x < 16) sums[y * get_local_size(0) + x] = sum;
}
