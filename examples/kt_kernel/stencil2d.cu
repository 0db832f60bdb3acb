/*
 * A 5-point stencil over a width x height grid of floats, edges clamped:
 *
 *     dst[y][x] = 0.5 src[y][x] + 0.125 (src[y][x-1] + src[y][x+1] + src[y-1][x] + src[y+1][x])
 *
 * Written for Kernel Tuner: block_size_x, block_size_y, tile_size_x and tile_size_y are #defined by the tuner.
 * Each thread computes tile_size_x by tile_size_y points, block_size_x (and block_size_y) apart, so that the
 * threads of a warp read and write neighbouring addresses.
 */
__global__ void stencil2d(float *dst, const float *src, int width, int height) {
    int x0 = blockIdx.x * block_size_x * tile_size_x + threadIdx.x;
    int y0 = blockIdx.y * block_size_y * tile_size_y + threadIdx.y;

    #pragma unroll
    for (int ty = 0; ty < tile_size_y; ty++) {
        int y = y0 + ty * block_size_y;
        if (y < height) {
            int up = max(y - 1, 0) * width;
            int down = min(y + 1, height - 1) * width;
            int row = y * width;

            #pragma unroll
            for (int tx = 0; tx < tile_size_x; tx++) {
                int x = x0 + tx * block_size_x;
                if (x < width) {
                    float left = src[row + max(x - 1, 0)];
                    float right = src[row + min(x + 1, width - 1)];
                    dst[row + x] = 0.5f * src[row + x] + 0.125f * (left + right + src[up + x] + src[down + x]);
                }
            }
        }
    }
}
