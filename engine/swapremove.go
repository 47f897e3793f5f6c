package engine

// swapRemove removes x from list, where pos(x) records its index, by moving the last element
// into its place: the loop's subscriber and connection lists are compact slices whose order
// does not matter. A list that does not hold x at pos(x) is returned unchanged.
func swapRemove[T any](list []*T, x *T, pos func(*T) *int32) []*T {
	i, last := int(*pos(x)), len(list)-1
	if i > last || list[i] != x {
		return list
	}
	list[i] = list[last]
	*pos(list[i]) = int32(i)
	list[last] = nil
	return list[:last]
}

// appendIndexed appends x to list, recording its index in pos(x) for swapRemove.
func appendIndexed[T any](list []*T, x *T, pos func(*T) *int32) []*T {
	*pos(x) = int32(len(list))
	return append(list, x)
}

// swapRemoveKeeping is swapRemove for a list that an iteration paused at mark has written up
// to mark (the fan-out's sweep: fanout_sweep.go): list[:mark] stays the elements visited.
// When x is before mark, the visited element at mark-1 takes its place and x leaves from
// there — else the last element, not visited yet, would move before mark and be skipped. It
// returns the list and the mark, one back in that case.
func swapRemoveKeeping[T any](list []*T, x *T, pos func(*T) *int32, mark int) ([]*T, int) {
	i := int(*pos(x))
	if i >= len(list) || list[i] != x {
		return list, mark
	}
	if i < mark {
		j := mark - 1
		list[i], list[j] = list[j], x
		*pos(list[i]), *pos(x) = int32(i), int32(j)
		mark = j
	}
	return swapRemove(list, x, pos), mark
}
