// Buffers in shared memory that a checkpoint reads file bytes into (pieces of large files, batches
// of small ones), reused once nothing holds their bytes any more. A new SharedArrayBuffer is zeroed
// and its pages faulted in on first touch: a first snapshot of 64 MiB spent ~70 ms of its main
// thread (of ~500) making them, for bytes that are read over at once. A reused one costs neither.

/**
 * One buffer and the holds on its bytes: whoever keeps a view of them past the call it was given in
 * holds it. Back in its pool when the last hold is released; a slab never released (a failed
 * attempt) is simply left to the garbage collector.
 */
export class Slab {
  private holds = 1;

  constructor(
    readonly buffer: Buffer,
    private readonly pool: Slabs,
  ) {}

  hold(): void {
    if (this.holds <= 0) throw new Error('a released slab was held again');
    this.holds += 1;
  }

  release(): void {
    if (this.holds <= 0) throw new Error('a slab was released more often than it was held');
    this.holds -= 1;
    if (this.holds === 0) this.pool.recycle(this.buffer);
  }
}

/** Slabs of one size; at most `keep` unused ones are kept (the others go to the garbage collector). */
export class Slabs {
  private readonly free: Buffer[] = [];

  constructor(
    readonly size: number,
    private readonly keep: number,
  ) {}

  /** A slab held once (by the caller), its bytes whatever they were: the caller writes before it reads. */
  take(): Slab {
    return new Slab(this.free.pop() ?? Buffer.from(new SharedArrayBuffer(this.size)), this);
  }

  recycle(buffer: Buffer): void {
    if (this.free.length < this.keep) this.free.push(buffer);
  }
}
