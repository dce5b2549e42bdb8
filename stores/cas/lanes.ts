// A bound on how many jobs of one kind run at once (zstd processes, puts to the store).

/** Runs at most `limit` of the jobs given to it at once; the others wait, lowest `rank` first (then in the order given). */
export class Lanes {
  private active = 0;
  private readonly waiting: { rank: number; start: () => void }[] = [];

  constructor(private readonly limit: number) {}

  async run<T>(job: () => Promise<T>, rank = 0): Promise<T> {
    if (this.active < this.limit) this.active += 1;
    else {
      // A lane is handed over by the job leaving it (active stays counted).
      await new Promise<void>((start) => {
        const at = this.waiting.findIndex((w) => w.rank > rank);
        this.waiting.splice(at < 0 ? this.waiting.length : at, 0, { rank, start });
      });
    }
    try {
      return await job();
    } finally {
      const next = this.waiting.shift();
      if (next) next.start();
      else this.active -= 1;
    }
  }
}
