package proxy

// claimWorker counts a new worker in unless Workers already run.
func (p *Loop) claimWorker() bool {
	for {
		n := p.running.Load()
		if n >= int64(p.o.Workers) {
			return false
		}
		if p.running.CompareAndSwap(n, n+1) {
			p.wg.Add(1)
			return true
		}
	}
}

// spawn starts a worker with j unless Workers already run.
func (p *Loop) spawn(j job) bool {
	if !p.claimWorker() {
		return false
	}
	go func() {
		defer p.wg.Done()
		for {
			p.run(p.ctx, j)
			select {
			case j = <-p.hand:
			case next, ok := <-p.work:
				if !ok {
					return
				}
				j = next
			}
		}
	}()
	return true
}
