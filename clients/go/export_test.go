package respcoord

// WithStreamsPerConnection lowers the watch pool's per-connection cap, so the
// external tests can see the pool grow without hundreds of streams.
var WithStreamsPerConnection = withStreamsPerConnection
