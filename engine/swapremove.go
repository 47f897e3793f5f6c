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
